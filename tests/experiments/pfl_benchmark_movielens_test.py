"""The personalization benchmark's MovieLens block on small generated ratings: each row's RMSE, per-client RMSE and
rating accuracy are those of a numpy computation written here (each client predicting with its own user embedding,
its personal copy, or its row of FedAvg's table); the user embedding is never aggregated (privacy audit of a
training round: no user embedding, nor a client's or the clients' sum or mean of them, in any server output); a
persistent private user embedding beats the mean-rating baseline; each method's learning rate and round are
selected on the validation ratings and tested once; the block's results are rows by RMSE that the results table
reads; bad flags get a clear error."""

import json
from typing import Any

import numpy as np
import pytest
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal.privacy import value_audit
from fedpersonal.simulation import client_loop
from fedpersonal.tasks import pfl_benchmark
from fedpersonal.tasks import pfl_benchmark_movielens as ml
from fedpersonal.tasks import pfl_benchmark_results as results_lib
from tests import tolerances

SMALL: dict[str, Any] = dict(
    dataset='movielens_synthetic',
    synthetic_users=10,
    synthetic_items=12,
    num_latent_factors=3,
    state_store='memory',
    client_learning_rate=0.1,
    batch_size=5,
    seeds=(0,),
)
ModelWeights = tff.learning.models.ModelWeights


@pytest.fixture(scope='module')
def benchmark():
    config = pfl_benchmark.PflBenchmarkConfig(**SMALL)
    return ml.MovieLensBenchmark(config, ml.load_data(config))


_PROCESSES = {}


def _process(benchmark, name):
    """The row's plan and training process (built once per module: building costs seconds)."""
    if name not in _PROCESSES:
        plan = ml.plan_for(name, benchmark)
        _PROCESSES[name] = plan, ml.build_process(benchmark, name, plan)
    return _PROCESSES[name]


def _numpy_metrics(benchmark, predict):
    """RMSE over every test rating, the mean and worst client RMSE and the rating accuracy (within 0.5), with
    ``predict(user, items) -> ratings`` (written here from the test ratings of the time split)."""
    test = benchmark.data.prepared.time_split_ratings['test']
    errors_, per_client = [], []
    for cid in benchmark.client_ids:
        rows = test[test.user_id == int(cid)]
        error = predict(int(cid), rows.item_id.to_numpy()) - rows.rating.to_numpy(np.float64)
        errors_.append(error)
        per_client.append(np.sqrt(np.mean(error**2)))
    every = np.concatenate(errors_)
    return {
        'rmse': np.sqrt(np.mean(every**2)),
        'accuracy': np.mean(np.abs(every) < 0.5),
        'mean_client_rmse': np.mean(per_client),
        'worst_client_rmse': np.max(per_client),
        'errors': every,
    }


def _assert_metrics(got, want, steps=1):
    """The package's float32 metrics against this float64 computation: each rating's dot product (at most 8 factors)
    and the sums over every test rating, within float32's reassociation bound (`tests/tolerances.py`; `steps` where
    the weights were trained on both sides); the accuracy counts |error| < 0.5, so a rating whose error is that
    close to 0.5 may count on one side only."""
    every = want.pop('errors')
    bound = dict(depth=8 + every.size, steps=steps)
    margin = tolerances.reorder_bound(scale=tolerances.magnitude(every), **bound)
    near = np.sum(np.abs(np.abs(every) - 0.5) <= margin)
    for key, value in want.items():
        if key == 'accuracy':
            assert abs(got[key] - value) <= (near + 1) / every.size * (1 + 1e-6), (key, got[key], value, near)
        else:
            tolerances.assert_reordered_close(got[key], value, err_msg=key, **bound)


def _one_round(benchmark, name):
    plan, process = _process(benchmark, name)
    dataset_fn = benchmark.task.table_dataset_fn if name == 'fedavg' else benchmark.task.personal_dataset_fn
    data = [dataset_fn(benchmark.train[c]) for c in benchmark.client_ids]
    privates = [process.initial_private_state()] * len(data)
    output = process.run_round(process.initialize(), data, privates)
    return plan, process.get_model_weights(output.state), list(output.private_states)


@pytest.mark.parametrize('name', ['fedper', 'ditto', 'fedavg'])
def test_each_client_is_scored_with_its_own_user_embedding_as_numpy_scores_it(benchmark, name):
    plan, weights, privates = _one_round(benchmark, name)
    got = ml.make_evaluation(benchmark, name, plan, 'test')(weights, privates)
    ids = [int(c) for c in benchmark.client_ids]
    if name == 'fedper':  # The global items, each client's own user row.
        items = np.asarray(weights.trainable[0])
        users = {u: np.asarray(p.trainable[0])[0] for u, p in zip(ids, privates)}
    elif name == 'ditto':  # Each client's personal copy: its items and its user row.
        copies = {u: [np.asarray(v) for v in p.trainable] for u, p in zip(ids, privates)}
        _assert_metrics(got, _numpy_metrics(benchmark, lambda u, i: copies[u][0][i] @ copies[u][1][0]))
        return
    else:  # FedAvg's table: the items and every user's row, told apart by their shapes.
        num_items = benchmark.task.num_items
        (items,) = [np.asarray(w) for w in weights.trainable if np.shape(w)[0] == num_items]
        (table,) = [np.asarray(w) for w in weights.trainable if np.shape(w)[0] == benchmark.task.num_users]
        users = {u: table[u] for u in ids}
    _assert_metrics(got, _numpy_metrics(benchmark, lambda u, i: items[i] @ users[u]))


def _canary_states(process, n, base):
    """Each client's private user embedding: a distinct exact float32 pattern near 1 (canaries scaled by 2^-13)."""
    initial = process.initial_private_state()
    assert [np.shape(v) for v in initial.trainable] == [(1, SMALL['num_latent_factors'])]
    return [
        ModelWeights([value_audit.canary_pattern([1, SMALL['num_latent_factors']], client=c, base=base) / 8192], [])
        for c in range(n)
    ]


def _flat(states):
    return [np.concatenate([np.ravel(w) for w in s.trainable]) for s in states]


@pytest.mark.parametrize('name', ['fedper', 'furl'])
def test_the_user_embedding_is_never_aggregated(benchmark, name):
    """Only the items are global; the clients' user embeddings (canaries) steer the item updates by design, but no
    embedding, sum or mean of them appears in the server state or the round's metrics."""
    _, process = _process(benchmark, name)
    state = process.initialize()
    num_items, dim = benchmark.task.num_items, SMALL['num_latent_factors']
    assert [np.shape(w) for w in process.get_model_weights(state).trainable] == [(num_items, dim)]
    data = [benchmark.task.personal_dataset_fn(benchmark.train[c]) for c in benchmark.client_ids]
    report = value_audit.audit_round_values(
        lambda p: process.run_round(state, data, p),
        _canary_states(process, len(data), value_audit.CANARY_BASE),
        _canary_states(process, len(data), 5003.5),
        canaries=_flat,
    )
    assert report.sightings == [], report.sightings
    # Positive control: the embeddings are read (the item update depends on them), so the audit looked at them.
    assert any(path.startswith('state/') for path in report.changed), report.changed


def test_ditto_global_model_never_depends_on_the_personal_copies(benchmark):
    _, process = _process(benchmark, 'ditto')
    state = process.initialize()
    data = [benchmark.task.personal_dataset_fn(benchmark.train[c]) for c in benchmark.client_ids]

    def copies(base):
        out = []
        for c in range(len(data)):
            shapes = [np.shape(w) for w in process.initial_private_state().trainable]
            out.append(
                ModelWeights(
                    [
                        value_audit.canary_pattern(s, client=c, base=base + 1000 * k) / 8192
                        for k, s in enumerate(shapes)
                    ],
                    [],
                )
            )
        return out

    report = value_audit.audit_round_values(
        lambda p: process.run_round(state, data, p), copies(value_audit.CANARY_BASE), copies(5003.5), canaries=_flat
    )
    assert report.sightings == []
    assert not any(path.startswith('state/') for path in report.changed), report.changed


def test_the_learning_rate_and_round_are_selected_on_validation_and_tested_once(tmp_path):
    """Each method's client learning rate is the one of the lowest validation RMSE with the first seed (the other
    seeds run only with it); each run tests the model of its best validation round: the same test RMSE as a run
    stopped at that round. A persistent private user embedding beats predicting the mean training rating."""
    small = {**SMALL, 'synthetic_users': 30, 'synthetic_items': 40, 'num_latent_factors': 8}
    config = pfl_benchmark.PflBenchmarkConfig(
        **{**small, 'seeds': (0, 1)},
        configurations=('fedper',),
        client_learning_rates=(0.3, 0.003, 100.0),  # 100 diverges: never chosen, the others go on.
        total_rounds=30,
        rounds_per_eval=5,
        output_dir=str(tmp_path / 'selection'),
    )
    results = pfl_benchmark.run(config)
    (row,) = results['rows']
    assert (results['dataset'], results['partition'], results['metric'], results['clients']) == (
        'movielens_synthetic',
        ml.PARTITION,
        'rmse',
        30,
    )
    selection = row['learning_rate_selection']
    assert set(selection) == {'0.3', '0.003', '100'} and row['client_learning_rate'] == 0.3
    assert selection['0.3'] < selection['0.003'] and selection['100'] is None, selection
    diverged = json.loads((tmp_path / 'selection' / 'fedper' / 'lr100' / 'seed0' / 'results.json').read_text())
    assert 'non-finite training loss' in diverged['diverged'], diverged
    assert not (tmp_path / 'selection' / 'fedper' / 'lr0.003' / 'seed1').exists()  # Seed 1 runs the chosen rate only.
    assert row['validation_rmse'] == pytest.approx(np.mean([min(v for _, v in c) for c in _seed_curves(tmp_path)]))
    prepared = ml.load_data(config).prepared
    train, test = prepared.time_split_ratings['train'], prepared.time_split_ratings['test']
    baseline = float(np.sqrt(np.mean((test.rating.to_numpy() - train.rating.mean()) ** 2)))
    assert row['rmse'] < 0.85 * baseline, (row['rmse'], baseline)
    # Seed 1's best validation round comes before its last: its test RMSE is that of a run stopped there.
    seed1 = row['per_seed'][1]
    assert seed1['best_round'] < 30, seed1
    stopped = pfl_benchmark.PflBenchmarkConfig(
        **{**small, 'seeds': (1,), 'client_learning_rate': 0.3},
        configurations=('fedper',),
        engine_strategy='client_loop',  # The block's processes take --engine_strategy (auto: the sparse lockstep).
        total_rounds=seed1['best_round'],
        rounds_per_eval=seed1['best_round'],
        output_dir=str(tmp_path / 'stopped'),
    )
    (stopped_row,) = pfl_benchmark.run(stopped)['rows']
    # The same rounds in the client loop instead of the sparse lockstep: equal within float32 reassociation (8
    # factors and 2 biases a rating, a batch of 5, the sums over at most 30 x 40 test ratings; every round's steps
    # over a user's at most 40 ratings).
    steps = seed1['best_round'] * 40 // 5
    tolerances.assert_reordered_close(stopped_row['rmse'], seed1['rmse'], depth=8 + 2 + 5 + 30 * 40, steps=steps)
    strategies = [
        json.loads((tmp_path / d / 'fedper' / p / 'engine_strategy.json').read_text())
        for d, p in (('selection', 'lr0.3/seed1'), ('stopped', 'seed1'))
    ]
    assert [s['engine_strategy'] for s in strategies] == [client_loop.SPARSE_LOCKSTEP, 'client_loop']
    docs = results_lib.docs_results([str(tmp_path / 'selection')])
    (doc_row,) = docs['rows']
    assert doc_row['metric'] == 'rmse' and doc_row['rmse'] == row['rmse'] and 'pfllib_accuracy' not in doc_row
    assert doc_row['learning_rate_selection'] == selection
    table = results_lib.markdown_table(docs['rows'])
    assert 'validation RMSE' in table and '**0.3** (0.3: ' in table and '100: diverged)' in table and 'FedPer' in table


def _seed_curves(tmp_path):
    """The validation RMSE curve of each seed's run with the chosen rate (read from their rows)."""
    runs = [tmp_path / 'selection' / 'fedper' / 'lr0.3' / f'seed{s}' / 'results.json' for s in (0, 1)]
    return [json.loads(path.read_text())['curve'] for path in runs]


@pytest.mark.parametrize(
    'flags, message',
    [
        (dict(dataset='movielens_synthetic', configurations=('fedrep',)), 'fedrep'),
        (dict(dataset='movielens'), '--data_dir'),
        (dict(dataset='movielens_synthetic', num_latent_factors=0), 'num_latent_factors'),
        (dict(dataset='synthetic', client_learning_rates=(0.1, 0.2)), 'validation split'),
        (dict(dataset='movielens_synthetic', client_learning_rates=(0.1, 0.1)), 'distinct'),
    ],
)
def test_bad_flags_name_the_problem(flags, message):
    with pytest.raises(errors.ConfigError, match=message):
        pfl_benchmark.PflBenchmarkConfig(**flags)


def test_movielens_defaults_to_its_own_methods():
    config = pfl_benchmark.PflBenchmarkConfig(dataset='movielens_synthetic')
    assert config.configurations == ('fedavg', 'fedavg_ft', 'fed_recon', 'fedper', 'furl', 'ditto')


def test_fedavg_fine_tuning_equals_a_numpy_sgd_loop(benchmark):
    """FedAvg+FT: each client's personal model (the table's items and its own row) trained by plain SGD on its train
    ratings in time order (batches of `batch_size`, MSE, `finetune_epochs` epochs) by hand here, then scored."""
    plan, weights, privates = _one_round(benchmark, 'fedavg')
    got = ml.make_evaluation(benchmark, 'fedavg_ft', plan, 'test')(weights, privates)
    config, num_items = benchmark.config, benchmark.task.num_items
    (items,) = [np.asarray(w, np.float64) for w in weights.trainable if np.shape(w)[0] == num_items]
    (table,) = [np.asarray(w, np.float64) for w in weights.trainable if np.shape(w)[0] == benchmark.task.num_users]
    train = benchmark.data.prepared.time_split_ratings['train'].sort_values(['timestamp', 'item_id'], kind='stable')
    tuned = {}
    for cid in benchmark.client_ids:
        rows = train[train.user_id == int(cid)]
        v, u = items.copy(), table[int(cid)].copy()
        for _ in range(config.finetune_epochs):
            for start in range(0, len(rows), config.batch_size):
                batch = rows.iloc[start : start + config.batch_size]
                i, y = batch.item_id.to_numpy(), batch.rating.to_numpy(np.float64)
                error = v[i] @ u - y
                grad_u = 2.0 / len(i) * error @ v[i]
                grad_v = np.zeros_like(v)
                np.add.at(grad_v, i, 2.0 / len(i) * error[:, None] * u[None, :])
                u, v = u - config.client_learning_rate * grad_u, v - config.client_learning_rate * grad_v
        tuned[int(cid)] = (v, u)
    # Fine-tuned in float32 there, in float64 here: every train batch of every epoch is a step.
    steps = config.finetune_epochs * -(-len(train) // config.batch_size)
    _assert_metrics(got, _numpy_metrics(benchmark, lambda user, i: tuned[user][0][i] @ tuned[user][1]), steps=steps)
