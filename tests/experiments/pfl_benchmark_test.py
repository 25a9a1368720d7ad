"""The personalization benchmark (PFLlib's leaderboard task) on a small generated partition: every client's test
accuracy is what a plain Keras forward pass with its own model gives (the global model plus its local layers, its
personal copy, APFL's mixture, FedRoD's two heads; FedBABU's after fine-tuning by a plain Keras loop), personalized
methods beat FedAvg under pathological label skew, the results file and figure are written, a row is the mean and std
over its seeds (against a hand computation), a rerun runs only the (method, seed) runs that did not finish, a seed
sets the initial weights and each client's train order, and bad flags get a clear error."""

import copy
import csv
import dataclasses
import json
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import errors
from fedpersonal.core import client_plan
from fedpersonal.models import image_classifiers
from fedpersonal.tasks import pfl_benchmark
from fedpersonal.tasks import pfl_benchmark_evaluation
from fedpersonal.tasks import pfl_benchmark_methods
from tests import tolerances

SMALL = dict(
    dataset='synthetic',
    synthetic_examples=1200,
    num_clients=5,
    state_store='memory',
    client_learning_rate=0.05,
    seeds=(0,),
)


@pytest.fixture(scope='module')
def benchmark():
    config = pfl_benchmark.PflBenchmarkConfig(**SMALL)
    return pfl_benchmark_evaluation.Benchmark(config, pfl_benchmark.load_data(config))


# A logit of PFLlib's CNN: the convolutions' 5 x 5 and 5 x 5 x 32 terms, the dense layers' 1024, 512 and 10 inputs.
LOGIT_DEPTH = 25 + 800 + 1024 + 512 + 10
TIES = []  # Per _keras_accuracy call: each client's predictions whose top two logits are within the bound.


def _keras_accuracy(benchmark, weights, local_layers, private_state, depth=LOGIT_DEPTH, steps=1):
    """Correct test predictions per client with a Keras CNN given the client's weights layer by layer (written
    here: the model's weighted layers in order, each layer's variables from the global or the private state).

    Another evaluation of the same weights (the engine's, XLA's order of sums) may flip a prediction whose top two
    logits are closer than their reassociation bound (`tests/tolerances.py`); each client's count of those is
    appended to `TIES` for `_assert_accuracies` (`depth` and `steps`: of the computation giving the weights and
    logits, when the weights themselves were trained on both sides)."""
    correct, total, ties = [], [], []
    for cid, state in zip(benchmark.client_ids, private_state):
        model = image_classifiers.fedavg_cnn(benchmark.data.x.shape[1:], 10)
        shared, own = iter(weights), iter(state)
        for layer in [layer for layer in model.layers if layer.weights]:
            source = own if local_layers == 'all' or layer.name in local_layers else shared
            layer.set_weights([np.asarray(next(source)) for _ in layer.weights])
        rows = benchmark.data.partition.test[int(cid)]
        logits = model(benchmark.data.x[rows], training=False).numpy()
        correct.append(int(np.sum(np.argmax(logits, -1) == benchmark.data.y[rows])))
        total.append(len(rows))
        top_two = np.sort(logits, -1)[:, -2:]
        margin = 2 * tolerances.reorder_bound(depth=depth, steps=steps, scale=tolerances.magnitude(logits))
        ties.append(int(np.sum(top_two[:, 1] - top_two[:, 0] <= margin)))
    TIES.append(np.array(ties))
    return np.array(correct), np.array(total)


def _assert_accuracies(got, correct, total, ties=None):
    """`got`'s accuracies (the package's evaluation) against counts made here: equal but for predictions on a near
    tie (`_keras_accuracy`), each a whole example; the quotients themselves within float32's rounding of them."""
    ties = TIES[-1] if ties is None else ties
    rounding = 4 * tolerances.U32  # A float32 quotient, its mean over clients in float64.
    assert abs(got['accuracy'] * total.sum() - correct.sum()) <= ties.sum() + rounding * total.sum(), (got, ties)
    per_client = correct / total
    slack = np.max(ties / total) + rounding
    assert abs(got['worst_client_accuracy'] - np.min(per_client)) <= slack, (got, ties)
    if 'mean_client_accuracy' in got:
        assert abs(got['mean_client_accuracy'] - np.mean(per_client)) <= np.mean(ties / total) + rounding, got


@pytest.mark.parametrize('name', ['fedper', 'lg_fedavg', 'ditto', 'apfl', 'apfl@paper', 'furl_head'])
def test_each_client_is_evaluated_with_its_own_model(benchmark, name):
    name, _, variant = name.partition('@')
    spec = pfl_benchmark_methods.METHOD_SPECS[name]
    config = dataclasses.replace(benchmark.config, apfl_variant=variant or benchmark.config.apfl_variant)
    plan = spec.plan(config)
    with backends.use('engine'):
        process = backends.build_process(
            plan,
            pfl_benchmark_methods.model_fn_for(benchmark.data, 0, () if plan.personal else spec.local_layers),
            loss_fn=pfl_benchmark_methods.loss_fn,
            metrics_fn=pfl_benchmark_methods.metrics_fn,
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        )
    train = {c: benchmark.train_dataset(d) for c, d in benchmark.train.items()}
    privates = [process.initial_private_state()] * len(benchmark.client_ids)
    output = process.run_round(process.initialize(), [train[c] for c in benchmark.client_ids], privates)
    weights = process.get_model_weights(output.state)
    privates = list(output.private_states)
    got = pfl_benchmark_evaluation.make_evaluation(benchmark, plan, spec.local_layers)(weights, privates)

    if plan.personal:  # The personal model, by hand: the paper's APFL mixture written here (PFLlib's: v itself).
        states = []
        for p in privates:
            values = [np.asarray(v) for v in p.trainable]
            if name == 'apfl' and config.apfl_variant == 'pfllib':
                values = values[:-1]
            elif plan.personalization is not None:
                *values, alpha = values
                a = np.clip(alpha, 0, 1)
                values = [a * v + (1 - a) * np.asarray(w) for v, w in zip(values, weights.trainable)]
            states.append(values)
        correct, total = _keras_accuracy(benchmark, [], 'all', states)
    else:
        correct, total = _keras_accuracy(
            benchmark, list(weights.trainable), spec.local_layers, [list(p.trainable) for p in privates]
        )
    _assert_accuracies(got, correct, total)


def test_fedrod_clients_predict_with_the_sum_of_both_heads(benchmark):
    spec = pfl_benchmark_methods.METHOD_SPECS['fedrod']
    plan = spec.plan(benchmark.config)
    model_fn = spec.phased_model(benchmark.data, 0)
    with backends.use('engine'):
        process = backends.build_process(
            plan,
            model_fn,
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
            element_spec=pfl_benchmark_methods.element_spec(benchmark.data),
        )
    train = [benchmark.train_dataset(benchmark.train[c]) for c in benchmark.client_ids]
    output = process.run_round(process.initialize(), train, [process.initial_private_state()] * len(train))
    weights, privates = process.get_model_weights(output.state), list(output.private_states)
    got = pfl_benchmark_evaluation.make_evaluation(benchmark, plan, spec.local_layers, phased_model=model_fn)(
        weights, privates
    )

    correct, total, ties = [], [], []
    for cid, private in zip(benchmark.client_ids, privates):
        model = image_classifiers.fedavg_cnn(benchmark.data.x.shape[1:], 10)
        model.set_weights([np.asarray(w) for w in weights.trainable])
        features = tf.keras.Model(model.inputs, model.get_layer('fc1').output)
        rows = benchmark.data.partition.test[int(cid)]
        x = benchmark.data.x[rows]
        kernel, bias = [np.asarray(v) for v in private.trainable]
        logits = model(x).numpy() + features(x).numpy() @ kernel + bias
        correct.append(int(np.sum(np.argmax(logits, -1) == benchmark.data.y[rows])))
        top_two = np.sort(logits, -1)[:, -2:]
        margin = 2 * tolerances.reorder_bound(depth=LOGIT_DEPTH + 512, scale=tolerances.magnitude(logits))
        ties.append(int(np.sum(top_two[:, 1] - top_two[:, 0] <= margin)))
        total.append(len(rows))
    _assert_accuracies(got, np.array(correct), np.array(total), np.array(ties))


def test_fine_tuning_before_evaluation_equals_a_keras_loop(benchmark):
    """FedBABU's evaluation: each client's model (the global body, its initial head) trained by plain SGD on its
    train batches for `finetune_epochs`, by hand here, then its test accuracy."""
    config = pfl_benchmark.PflBenchmarkConfig(**SMALL, finetune_epochs=1)
    benchmark = pfl_benchmark_evaluation.Benchmark(config, benchmark.data)
    spec = pfl_benchmark_methods.METHOD_SPECS['fedbabu']
    plan = spec.plan(config)
    with backends.use('engine'):
        process = backends.build_process(
            plan,
            pfl_benchmark_methods.model_fn_for(benchmark.data, 0, spec.local_layers),
            loss_fn=pfl_benchmark_methods.loss_fn,
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        )
    train = [benchmark.train_dataset(benchmark.train[c]) for c in benchmark.client_ids]
    initial_head = [np.asarray(v) for v in process.initial_private_state().trainable]
    output = process.run_round(process.initialize(), train, [process.initial_private_state()] * len(train))
    weights = process.get_model_weights(output.state)
    for private in output.private_states:  # The head is frozen in training.
        for got, want in zip(private.trainable, initial_head):
            np.testing.assert_array_equal(got, want)
    got = pfl_benchmark_evaluation.make_evaluation(benchmark, plan, spec.local_layers, finetune=True)(
        weights, list(output.private_states)
    )

    tuned = []
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for dataset in train:
        model = image_classifiers.fedavg_cnn(benchmark.data.x.shape[1:], 10)
        model.set_weights([np.asarray(w) for w in weights.trainable] + initial_head)
        for batch in dataset:
            with tf.GradientTape() as tape:
                value = loss(batch['y'], model(batch['x'], training=True))
            for variable, gradient in zip(model.trainable_variables, tape.gradient(value, model.trainable_variables)):
                variable.assign_sub(config.client_learning_rate * gradient)
        tuned.append([v.numpy() for v in model.weights])
    # Fine-tuned on both sides (the engine's and Keras's order of sums): forward and backward through the CNN, a batch
    # of 10, each client's (at most 24) train batches.
    correct, total = _keras_accuracy(benchmark, [], 'all', tuned, depth=2 * LOGIT_DEPTH + 10, steps=24)
    _assert_accuracies(got, correct, total)


def test_per_fedavg_clients_are_evaluated_after_one_sgd_step_on_their_first_train_batch(benchmark):
    spec = pfl_benchmark_methods.METHOD_SPECS['per_fedavg']
    plan = spec.plan(benchmark.config)
    model = image_classifiers.fedavg_cnn(benchmark.data.x.shape[1:], 10, seed=benchmark.config.seed)
    weights = tff.learning.models.ModelWeights([w.numpy() for w in model.trainable_weights], [])
    privates = [tff.learning.models.ModelWeights([], [])] * len(benchmark.client_ids)
    got = pfl_benchmark_evaluation.make_evaluation(benchmark, plan, spec.local_layers, adapts=True)(weights, privates)
    states = []
    for cid in benchmark.client_ids:  # By hand: Keras SGD on the client's first 10 train rows.
        model = image_classifiers.fedavg_cnn(benchmark.data.x.shape[1:], 10)
        model.set_weights(weights.trainable)
        rows = benchmark.train_rows[int(cid)][: benchmark.config.batch_size]
        with tf.GradientTape() as tape:
            logits = model(benchmark.data.x[rows], training=True)
            loss = tf.keras.losses.sparse_categorical_crossentropy(benchmark.data.y[rows], logits, from_logits=True)
            loss = tf.reduce_mean(loss)
        grads = tape.gradient(loss, model.trainable_weights)
        lr = benchmark.config.client_learning_rate
        states.append([(w - lr * g).numpy() for w, g in zip(model.trainable_weights, grads)])
    correct, total = _keras_accuracy(benchmark, [], 'all', states)
    _assert_accuracies(got, correct, total)
    unadapted, _ = _keras_accuracy(benchmark, [], 'all', [weights.trainable] * len(states))
    assert not np.array_equal(unadapted, correct)  # The step changes predictions: the comparison can fail.


def test_per_fedavg_trains_twice_a_round_as_pfllib_and_adapts_on_what_a_small_client_has(benchmark):
    for name in ('per_fedavg', 'per_fedavg_hf'):
        plan = pfl_benchmark_methods.METHOD_SPECS[name].plan
        config = benchmark.config
        assert [p.epochs for p in plan(config).phases] == [2 * config.client_epochs]  # PFLlib's default: 2.
        once = dataclasses.replace(config, per_fedavg_trains_per_round=1, client_epochs=3)
        assert [p.epochs for p in plan(once).phases] == [3]
    # Fewer train examples than a batch: the client adapts on all of them (a dropped last batch would leave none).
    few = copy.copy(benchmark)
    cid = benchmark.client_ids[0]
    few.train = {**benchmark.train, cid: benchmark.train[cid].take(6)}
    batch = few.adaptation_batch(cid)
    assert len(batch['y']) == 6 and np.array_equal(batch['y'], benchmark.data.y[benchmark.train_rows[0][:6]])
    few.train[cid] = benchmark.train[cid].take(0)
    assert few.adaptation_batch(cid) is None
    assert len(few.adaptation_batch(benchmark.client_ids[1])['y']) == benchmark.config.batch_size


def test_personalized_methods_beat_fedavg_under_pathological_skew_and_results_are_written(tmp_path):
    config = pfl_benchmark.PflBenchmarkConfig(
        **SMALL,
        configurations=('fedavg', 'fedper', 'ditto', 'fedbabu', 'fed_recon'),
        total_rounds=4,
        rounds_per_eval=2,
        finetune_epochs=1,
        output_dir=str(tmp_path),
    )
    results = pfl_benchmark.run(config)
    rows = {row['method']: row for row in results['rows']}
    for name in ('fedper', 'ditto', 'fedbabu'):
        assert rows[name]['accuracy'] > rows['fedavg']['accuracy'] + 0.2, rows
    # ReconEval (a head reconstructed from its initializer on each client's support half) far above chance (0.1).
    assert rows['fed_recon']['accuracy'] > 0.4, rows
    for row in rows.values():
        assert row['rounds'] == 4 and [r for r, _, _ in row['curve']] == [2, 4]
        assert row['best_accuracy'] == max(a for _, a, _ in row['curve'])
        assert 0.0 <= row['worst_client_accuracy'] <= row['mean_client_accuracy'] <= 1.0
    with open(tmp_path / 'results.json') as f:
        assert json.load(f)['partition'] == 'pathological'
    # How the engine ran each method ('auto': the CNN runs the client loop, spread where several cores are allowed).
    recorded = {}
    for path in tmp_path.rglob('engine_strategy.json'):
        with open(path) as f:
            recorded[str(path.parent.relative_to(tmp_path))] = json.load(f)
    assert len(recorded) == 5 and all(r['engine_strategy'].startswith('client_loop') for r in recorded.values())
    assert os.path.getsize(tmp_path / 'accuracy_by_round.png') > 0


def test_the_other_rows_learn_on_the_per_client_backend_as_the_binary_runs_them(tmp_path):
    """The rows the test above leaves out, from the benchmark's own run on TFF's per-client backend (every method
    runs on the engine in the other tests): the head-local, body-local and fine-tuning rows fit the clients' two
    labels far above FedAvg's global model; FedProx learns as FedAvg does."""
    config = pfl_benchmark.PflBenchmarkConfig(
        **SMALL,
        configurations=('fedavg', 'fedprox', 'fedrep', 'lg_fedavg', 'fedavg_ft', 'furl_head'),
        total_rounds=4,
        rounds_per_eval=2,
        finetune_epochs=1,
        simulation='per_client',
        output_dir=str(tmp_path),
    )
    rows = {row['method']: row for row in pfl_benchmark.run(config)['rows']}
    for name in ('fedrep', 'lg_fedavg', 'fedavg_ft', 'furl_head'):  # FedAvg about 0.8 at round 4, they near 1.
        assert rows[name]['accuracy'] > rows['fedavg']['accuracy'] + 0.15, rows
    for name in ('fedavg', 'fedprox'):  # Rising from round 2 to round 4, well above chance (0.1).
        (_, first, _), (_, last, _) = rows[name]['curve']
        assert last > first and last > 0.25, rows[name]
    assert rows['fedprox']['accuracy'] == pytest.approx(rows['fedavg']['accuracy'], abs=0.05)
    assert not list(tmp_path.rglob('engine_strategy.json'))  # No engine ran.


def test_summary_reads_the_runs_rows():
    rows = [
        {'round': r, 'test/accuracy': a, 'test/mean_client_accuracy': a, 'test/worst_client_accuracy': a / 2}
        for r, a in ((10, 0.5), (20, 0.7), (30, 0.6), (40, 0.62), (50, 0.64))
    ]
    row = pfl_benchmark.summarize(rows + [{'round': 51}], seconds_per_round=1.5)
    assert (row['rounds'], row['accuracy'], row['best_accuracy'], row['best_round']) == (50, 0.64, 0.7, 20)
    assert row['slope_last_10pct'] == pytest.approx(0.002)  # Rounds 40 and 50: 0.02 over 10 rounds.


def test_a_diverged_evaluation_is_never_the_best():
    # An RMSE run whose first evaluation was not finite (FedAvg+FT fine-tuning an untrained MovieLens model):
    # the best so far is the lowest finite RMSE, not the NaN met first (`max` keeps it).
    rows = [
        {'round': r, 'test/rmse': v, 'test/mean_client_rmse': v, 'test/worst_client_rmse': v}
        for r, v in ((20, float('nan')), (40, 2.5), (60, 1.2), (80, 1.3))
    ]
    row = pfl_benchmark.summarize(rows, seconds_per_round=None, metric='rmse')
    assert (row['rmse'], row['best_rmse'], row['best_round']) == (1.3, 1.2, 60)


@pytest.mark.parametrize(
    'flags, message',
    [
        (dict(partition='stripes'), 'partition must be one of'),
        (dict(configurations=('fedavg', 'fedsgd')), "unknown: ['fedsgd']"),
        (dict(apfl_alpha=1.5), '--apfl_alpha must be <= 1.0, got 1.5.'),
        (dict(per_fedavg_trains_per_round=0), 'per_fedavg_trains_per_round must be >= 1, got 0'),
        (dict(engine_strategy='fastest'), 'engine_strategy must be one of'),
        (dict(epoch_order='random'), "epoch_order must be one of ('reshuffled', 'fixed'), got 'random'"),
        (dict(seeds=(0, 0)), 'seeds must be distinct non-negative integers, got [0, 0]'),
        (dict(seeds=(1, 2), seed=5), '--seed=5 is not one of --seeds=[1, 2]'),
    ],
)
def test_bad_flags_name_the_problem(flags, message):
    with pytest.raises(errors.ConfigError, match=re.escape(message)):
        pfl_benchmark.PflBenchmarkConfig(**{**SMALL, **flags})


def test_personalized_weights_of_a_plan_without_a_copy_are_its_local_weights():
    plan = pfl_benchmark_methods.METHOD_SPECS['fedper'].plan(pfl_benchmark.PflBenchmarkConfig(**SMALL))
    state = client_plan.ModelWeights([np.ones(2, np.float32)], [])
    assert np.array_equal(client_plan.personalized_weights(plan, None, state).trainable[0], np.ones(2))


# The final accuracies a stubbed method reaches with seeds 0, 1, 2 (and 3, added on a rerun).
STUB_FINAL = {'fedavg': (0.5, 0.6, 0.9, 0.7), 'fedper': (0.8, 0.8, 0.95, 0.85)}


def _stub_run_method(calls):
    """`run_method` without training: metric rows whose last accuracy is `STUB_FINAL[name][seed]`, read as the
    real runs' are (`summarize`)."""

    def run_method(benchmark, outputs, name):
        seed = benchmark.config.seed
        calls.append((name, seed, outputs.directory))
        final = STUB_FINAL[name][seed]
        rows = [
            {'round': 2, 'test/accuracy': 0.4, 'test/mean_client_accuracy': 0.4, 'test/worst_client_accuracy': 0.1},
            {'round': 4, 'test/accuracy': final, 'test/mean_client_accuracy': final, 'test/worst_client_accuracy': 0.2},
        ]
        return pfl_benchmark.summarize(rows, seconds_per_round=1.0 + seed**2)

    return run_method


def test_rows_are_means_over_seeds_and_a_rerun_runs_only_what_did_not_finish(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(pfl_benchmark, 'run_method', _stub_run_method(calls))
    config = pfl_benchmark.PflBenchmarkConfig(
        **{**SMALL, 'seeds': (0, 1, 2)}, configurations=('fedavg', 'fedper'), output_dir=str(tmp_path)
    )
    results = pfl_benchmark.run(config)
    assert [(n, s) for n, s, _ in calls] == [(n, s) for n in ('fedavg', 'fedper') for s in (0, 1, 2)]
    assert {d for _, _, d in calls} == {str(tmp_path / n / f'seed{s}') for n in ('fedavg', 'fedper') for s in (0, 1, 2)}
    fedavg = results['rows'][0]
    # By hand: 0.5, 0.6, 0.9 -> mean 2/3, sample std sqrt(((1/6)^2 + (1/15)^2 + (7/30)^2) / 2).
    assert fedavg['name'] == 'FedAvg' and fedavg['seeds'] == [0, 1, 2] and fedavg['rounds'] == 4
    assert 'seed' not in fedavg
    assert fedavg['accuracy'] == pytest.approx(2 / 3)
    assert fedavg['accuracy_std'] == pytest.approx(math.sqrt(((1 / 6) ** 2 + (1 / 15) ** 2 + (7 / 30) ** 2) / 2))
    assert fedavg['best_accuracy'] == pytest.approx((0.5 + 0.6 + 0.9) / 3)  # Each seed's best is its last here.
    assert fedavg['worst_client_accuracy'] == pytest.approx(0.2)
    assert fedavg['worst_client_accuracy_std'] == pytest.approx(0.0, abs=1e-12)
    assert fedavg['seconds_per_round'] == pytest.approx(2.0)  # The median of 1, 2 and 5 s (not their mean).
    assert fedavg['slope_last_10pct'] == pytest.approx(((0.5 - 0.4) + (0.6 - 0.4) + (0.9 - 0.4)) / 3 / 2)
    assert [r for r, _, _ in fedavg['curve']] == [2, 4]
    assert [m for _, m, _ in fedavg['curve']] == pytest.approx([0.4, 2 / 3])
    assert [s for _, _, s in fedavg['curve']] == pytest.approx([0.0, fedavg['accuracy_std']])

    # A rerun with a seed more runs only that seed; a run whose row is missing (killed before it finished) reruns.
    os.remove(tmp_path / 'fedper' / 'seed1' / 'results.json')
    calls.clear()
    results = pfl_benchmark.run(dataclasses.replace(config, seeds=(0, 1, 2, 3)))
    assert [(n, s) for n, s, _ in calls] == [('fedavg', 3), ('fedper', 1), ('fedper', 3)]
    fedper = results['rows'][1]
    assert fedper['seeds'] == [0, 1, 2, 3] and fedper['accuracy'] == pytest.approx((0.8 + 0.8 + 0.95 + 0.85) / 4)
    with open(tmp_path / 'results.json') as f:
        assert json.load(f)['rows'][0]['accuracy'] == pytest.approx((0.5 + 0.6 + 0.9 + 0.7) / 4)


def test_a_seed_sets_each_clients_train_order_and_the_partition_stays(benchmark):
    other = pfl_benchmark_evaluation.Benchmark(
        dataclasses.replace(benchmark.config, seed=1, seeds=(1,)), benchmark.data
    )
    again = pfl_benchmark_evaluation.Benchmark(benchmark.config, benchmark.data)
    for rows, mine, same, theirs in zip(
        benchmark.data.partition.train, benchmark.train_rows, again.train_rows, other.train_rows
    ):
        assert sorted(mine) == sorted(theirs) == sorted(rows)
        np.testing.assert_array_equal(mine, same)
    assert any(not np.array_equal(a, b) for a, b in zip(benchmark.train_rows, other.train_rows))
    first = next(iter(benchmark.train_dataset(benchmark.train['0'])))
    np.testing.assert_array_equal(first['y'], benchmark.data.y[benchmark.train_rows[0][: benchmark.config.batch_size]])
    # And the initial weights (notebooks/04 checks two trained seeds end to end).
    weights = [
        pfl_benchmark_methods.model_fn_for(benchmark.data, seed, ())().keras_model.weights[0].numpy() for seed in (0, 1)
    ]
    assert not np.array_equal(*weights)


def test_a_reshuffled_client_reads_a_new_order_of_its_rows_every_round(benchmark):
    """``epoch_order='reshuffled'``: round r's batches are the client's train rows permuted by (seed, r, client), the
    last partial batch dropped, so the dropped rows change from round to round; the same round gives the same
    batches (a resumed run trains as an uninterrupted one)."""
    size = 7  # 180 rows a client here: a partial last batch of 5.
    benchmark = pfl_benchmark_evaluation.Benchmark(
        dataclasses.replace(benchmark.config, batch_size=size), benchmark.data
    )

    def rows_of(client, round_num):
        ys = [b['y'] for b in benchmark.round_train_dataset(benchmark.client_ids[client], round_num)]
        xs = [b['x'] for b in benchmark.round_train_dataset(benchmark.client_ids[client], round_num)]
        assert all(len(y) == size for y in ys)
        x = np.concatenate(xs).reshape(sum(map(len, ys)), -1)
        pooled = benchmark.data.x[benchmark.train_rows[client]].reshape(len(benchmark.train_rows[client]), -1)
        # Each trained example is one of the client's rows (its position there): a permutation, none repeated.
        found = [int(np.flatnonzero((pooled == row).all(axis=1))[0]) for row in x]
        assert len(set(found)) == len(found) == len(benchmark.train_rows[client]) // size * size
        return found

    client = next(i for i, rows in enumerate(benchmark.train_rows) if len(rows) % size)  # One with a partial batch.
    first, second = rows_of(client, 1), rows_of(client, 2)
    assert first != second and rows_of(client, 1) == first
    assert set(range(len(benchmark.train_rows[client]))) - set(first) != set(
        range(len(benchmark.train_rows[client]))
    ) - set(second)


def test_reshuffled_rounds_train_on_each_rounds_order_on_both_backends(tmp_path):
    """The binary's default order, a new one every round, on the engine (clients packed afresh every round) and on
    TFF's per-client backend: every round's training loss agrees to float32 rounding (the bound); round 2's differs
    from a run in the fixed order by more than five bounds, so neither backend trains round 2 on round 1's order."""
    base = dict(SMALL, synthetic_examples=600, configurations=('fedavg',), total_rounds=2)
    losses = {}
    for name, extra in (
        ('engine', {}),
        ('per_client', dict(simulation='per_client')),
        ('fixed', dict(simulation='per_client', epoch_order='fixed')),
    ):
        out = tmp_path / name
        pfl_benchmark.run(pfl_benchmark.PflBenchmarkConfig(**base, **extra, rounds_per_eval=2, output_dir=str(out)))
        with open(out / 'fedavg' / 'seed0' / 'metrics.csv') as f:
            rows = list(csv.DictReader(f))
        losses[name] = [float(r['train/loss']) for r in rows if r.get('train/loss')]
    assert len(losses['engine']) == 2
    # As engine_workers_test's bound: PFLlib's CNN's sums forward and backward, a batch of 10, the mean over 5
    # clients; a client's (at most 600 / 5 / 10) batches a round, 2 rounds.
    bound = dict(depth=2 * (25 + 800 + 1024 + 512 + 10) + 10 + 5, steps=2 * 12)
    tolerances.assert_reordered_close(losses['engine'], losses['per_client'], **bound)
    gap = abs(losses['per_client'][1] - losses['fixed'][1])
    assert gap > 5 * tolerances.reorder_bound(scale=tolerances.magnitude(losses['fixed']), **bound), losses


def test_engine_workers_need_a_fixed_order(tmp_path):
    """They load each client by id, the same data every round: refused before any worker starts."""
    from fedpersonal.runtime import engine_workers

    config = pfl_benchmark.PflBenchmarkConfig(**SMALL, configurations=('fedavg',), output_dir=str(tmp_path))
    refused = pytest.raises(errors.ConfigError, match='Pass --epoch_order=fixed')
    with engine_workers.requested(engine_workers.Request(2)), refused:
        pfl_benchmark.run(config)
