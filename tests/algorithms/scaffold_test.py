"""SCAFFOLD on both backends equals a plain loop written here (two rounds: the control variates correct the second
round's steps), its c_i stays on the clients, and the correction matters."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.algorithms import scaffold
from fedpersonal.privacy import audit
from tests import tolerances
from tests.algorithms.fedper_fedrep_test import client_arrays
from tests.algorithms.fedper_fedrep_test import datasets
from tests.algorithms.fedprox_lg_fedavg_test import DEPTH  # The same model's rounding depth.
from tests.algorithms.fedprox_lg_fedavg_test import SPEC
from tests.algorithms.fedprox_lg_fedavg_test import keras_fn

LR, EPOCHS, ROUNDS = 0.1, 2, 2
SERVER_LR, PARTICIPATION = 0.5, 0.8


def build(backend, **kwargs):
    with backends.use(backend):
        return scaffold.build_scaffold(
            keras_fn,
            element_spec=SPEC,
            client_learning_rate=LR,
            client_epochs=EPOCHS,
            server_learning_rate=SERVER_LR,
            participation=PARTICIPATION,
            **kwargs,
        )


def reference_round(x, c, kept, arrays, corrected=True):
    """One SCAFFOLD round by hand (the paper's option II): each client makes EPOCHS passes of SGD (batches of 10 in
    order) with the gradient corrected by ``c - c_i``, then ``c_i+ = c_i - c + (x - y) / (K lr)``; the server adds
    SERVER_LR times the mean of ``y - x`` to x and PARTICIPATION times the mean of ``c_i+ - c_i`` to c."""
    dys, dcs, new_kept = [], [], []
    for (features, labels), ci in zip(arrays, kept):
        y = [tf.Variable(w) for w in x]
        steps = 0
        for _ in range(EPOCHS):
            for s in range(0, len(features), 10):
                with tf.GradientTape() as tape:
                    hidden = tf.nn.relu(tf.matmul(features[s : s + 10], y[0]) + y[1])
                    logits = tf.matmul(hidden, y[2]) + y[3]
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[s : s + 10], logits=logits)
                    )
                for v, g, cc, cci in zip(y, tape.gradient(loss, y), c, ci):
                    v.assign_sub(LR * (g + (cc - cci if corrected else 0.0)))
                steps += 1
        drift = [(w - v.numpy()) / (steps * LR) for w, v in zip(x, y)]
        new_kept.append([a - b + d for a, b, d in zip(ci, c, drift)])
        dys.append([v.numpy() - w for v, w in zip(y, x)])
        dcs.append([d - b for d, b in zip(drift, c)])
    mean = lambda deltas, k: sum(d[k] for d in deltas) / len(deltas)
    new_x = [w + SERVER_LR * mean(dys, k) for k, w in enumerate(x)]
    new_c = [b + PARTICIPATION * mean(dcs, k) for k, b in enumerate(c)]
    return new_x, new_c, new_kept


def _max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b))


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_scaffold_equals_a_plain_loop(backend):
    arrays = client_arrays(seed=6)
    process = build(backend)
    assert process.simulation == backend  # The context chose the backend.
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    server = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    x, c = server[:4], server[4:]
    kept = [[np.asarray(v) for v in p.trainable] for p in privates]
    for _ in range(ROUNDS):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        x, c, kept = reference_round(x, c, kept, arrays)
    ours = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    # Float32 rounding of the steps (reorder_bound), grown by the control variates: a round's c_i and c carry the
    # weights' error divided by K lr (K >= 4 steps: the 17-example client's 2 batches, 2 epochs), which the next
    # round's K' <= 8 steps of lr multiply back by K' lr: at most (1 + 8 / 4) = 3 times the error per round.
    steps = ROUNDS * EPOCHS * 4
    growth = 3.0**ROUNDS
    weight_bound = growth * tolerances.reorder_bound(depth=DEPTH, scale=1.0, steps=steps)
    control_bound = weight_bound / (4 * LR)
    np.testing.assert_allclose(
        np.concatenate([w.ravel() for w in ours[:4]]), np.concatenate([w.ravel() for w in x]), rtol=0, atol=weight_bound
    )
    np.testing.assert_allclose(
        np.concatenate([w.ravel() for w in ours[4:]]),
        np.concatenate([w.ravel() for w in c]),
        rtol=0,
        atol=control_bound,
    )
    for private, want in zip(privates, kept):
        np.testing.assert_allclose(
            np.concatenate([np.ravel(v) for v in private.trainable]),
            np.concatenate([w.ravel() for w in want]),
            rtol=0,
            atol=control_bound,
        )
    # The correction matters: uncorrected second-round steps end elsewhere (far beyond the bound).
    x0 = [np.asarray(w) for w in server[:4]]
    first = reference_round(x0, server[4:], [[np.zeros_like(w) for w in x0]] * len(arrays), arrays)
    uncorrected = reference_round(first[0], first[1], first[2], arrays, corrected=False)[0]
    assert _max_diff(uncorrected, x) > 10 * weight_bound


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_a_non_finite_client_is_left_out_and_keeps_its_control_variate(backend):
    """Round 2 with one client's features NaN (``non_finite='ignore'``): x and c move by the other clients' mean,
    as the plain loop over them, and that client keeps its c_i from round 1."""
    arrays = client_arrays(seed=7)
    process = build(backend)
    state = process.initialize()
    server = [np.asarray(w) for w in process.get_model_weights(state).trainable]
    x, c, kept = server[:4], server[4:], [[np.zeros_like(w) for w in server[:4]]] * len(arrays)
    output = process.run_round(state, datasets(arrays), [process.initial_private_state()] * len(arrays))
    x, c, kept = reference_round(x, c, kept, arrays)
    broken = list(arrays)
    broken[1] = (np.full_like(arrays[1][0], np.nan), arrays[1][1])
    second = process.run_round(output.state, datasets(broken), list(output.private_states), non_finite='ignore')
    finite = [0, 2, 3]
    x, c, new_kept = reference_round(x, c, [kept[i] for i in finite], [arrays[i] for i in finite])
    ours = [np.asarray(w) for w in process.get_model_weights(second.state).trainable]
    steps = ROUNDS * EPOCHS * 4  # As test_scaffold_equals_a_plain_loop's bound.
    weight_bound = 3.0**ROUNDS * tolerances.reorder_bound(depth=DEPTH, scale=1.0, steps=steps)
    np.testing.assert_allclose(_flat(ours[:4]), _flat(x), rtol=0, atol=weight_bound)
    np.testing.assert_allclose(_flat(ours[4:]), _flat(c), rtol=0, atol=weight_bound / (4 * LR))
    privates = list(second.private_states)
    np.testing.assert_array_equal(_flat(privates[1].trainable), _flat(output.private_states[1].trainable))
    for i, want in zip(finite, new_kept):
        np.testing.assert_allclose(_flat(privates[i].trainable), _flat(want), rtol=0, atol=weight_bound / (4 * LR))


def _flat(values):
    return np.concatenate([np.ravel(np.asarray(v)) for v in values])


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_scaffold_keeps_each_control_variate_on_its_client(backend):
    process = build(backend)
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    assert process.next.type_signature.result.private_states.placement is tff.CLIENTS


def test_scaffold_rejects_a_nonsense_participation():
    with pytest.raises(ValueError, match='participation'):
        scaffold.build_scaffold(keras_fn, element_spec=SPEC, client_learning_rate=LR, participation=1.5)


def test_scaffold_benchmark_row_scores_the_global_model_without_c(tmp_path):
    """The benchmark binary's row (`--configurations=scaffold`): its evaluation of the server's weights (x, then
    c) and the clients' c_i is FedAvg's evaluation of x alone; the row runs end to end."""
    from fedpersonal.tasks import pfl_benchmark  # The benchmark's modules, only for this test.
    from fedpersonal.tasks import pfl_benchmark_evaluation
    from fedpersonal.tasks import pfl_benchmark_methods

    small = dict(dataset='synthetic', synthetic_examples=1200, num_clients=5, state_store='memory', seeds=(0,))
    config = pfl_benchmark.PflBenchmarkConfig(**small, client_learning_rate=0.05)
    bench = pfl_benchmark_evaluation.Benchmark(config, pfl_benchmark.load_data(config))
    plan, _ = pfl_benchmark.method_parts(bench, 'scaffold')
    process = pfl_benchmark.build_method_process(bench, 'scaffold', plan, None)
    datasets_ = [bench.train_dataset(bench.train[c]) for c in bench.client_ids]
    output = process.run_round(process.initialize(), datasets_, [process.initial_private_state()] * len(datasets_))
    weights = process.get_model_weights(output.state)
    assert np.max(np.abs(weights.trainable[-1])) > 0  # c moved: the evaluation must leave it out.
    got = pfl_benchmark_evaluation.make_evaluation(bench, plan, ())(weights, list(output.private_states))
    fedavg = pfl_benchmark_methods.METHOD_SPECS['fedavg'].plan(config)
    x = tff.learning.models.ModelWeights(list(weights.trainable[:8]), list(weights.non_trainable))
    want = pfl_benchmark_evaluation.make_evaluation(bench, fedavg, ())(
        x, [tff.learning.models.ModelWeights([], [])] * 5
    )
    assert got == want
    results = pfl_benchmark.run(
        pfl_benchmark.PflBenchmarkConfig(
            **small, configurations=('scaffold',), total_rounds=2, rounds_per_eval=1, output_dir=str(tmp_path)
        )
    )
    assert [row['method'] for row in results['rows']] == ['scaffold']
