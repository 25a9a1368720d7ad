"""FedAMP on both backends equals a plain loop written here (three rounds over changing sets of clients: each
client's centre comes from the previous round's uploads, its own among them or not), the clients' models stay
theirs, and the proximal term matters."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.algorithms import fedamp
from fedpersonal.privacy import audit
from tests import tolerances
from tests.algorithms.fedper_fedrep_test import client_arrays
from tests.algorithms.fedper_fedrep_test import datasets
from tests.algorithms.fedprox_lg_fedavg_test import DEPTH  # The same model's rounding depth.
from tests.algorithms.fedprox_lg_fedavg_test import SPEC
from tests.algorithms.fedprox_lg_fedavg_test import keras_fn

LR, EPOCHS, CAPACITY = 0.1, 2, 4
ALPHA, SIGMA, LAMDA = 0.5, 2.0, 1.5
ROUNDS = ([0, 1, 2, 3], [0, 2, 3], [1, 2])  # The clients of each round.
PARAMETERS = 6 * 8 + 8 + 8 * 3 + 3  # The model's weights: the distance's sum.


def build(backend, variant=fedamp.PAPER, **kwargs):
    with backends.use(backend):
        return fedamp.build_fedamp(
            keras_fn,
            element_spec=SPEC,
            client_optimizer=tff.learning.optimizers.build_sgdm(LR),
            clients_per_round=CAPACITY,
            client_epochs=EPOCHS,
            alpha=ALPHA,
            sigma=SIGMA,
            lamda=LAMDA,
            variant=variant,
            **kwargs,
        )


def reference_centre(own, uploads, client, sigma=SIGMA):
    """PFLlib's ``send_models`` in float64: ``sum_{j != i} xi_j w_j + (1 - sum xi_j) w_i`` over the last uploads
    (``(client, model)`` pairs), ``xi_j = alpha exp(-||w_i - w_j||^2 / sigma) / sigma``."""
    flat = lambda model: np.concatenate([np.ravel(w) for w in model]).astype(np.float64)
    coefficients = [
        0.0 if j == client else ALPHA * math.exp(-float(np.sum((flat(own) - flat(w)) ** 2)) / sigma) / sigma
        for j, w in uploads
    ]
    centre = [(1.0 - sum(coefficients)) * np.float64(w) for w in own]
    for c, (_, model) in zip(coefficients, uploads):
        centre = [u + c * np.float64(w) for u, w in zip(centre, model)]
    return [u.astype(np.float32) for u in centre]


def reference_round(models, uploads, arrays, clients, proximal=True, sigma=SIGMA):
    """One FedAMP round by hand: each client's centre from `uploads`, then EPOCHS passes of SGD (batches of 10 in
    order) on its loss plus ``lamda / (2 alpha) ||w - u||^2`` from its own model; the round's uploads, in order."""
    models, new_uploads = list(models), []
    for i in clients:
        features, labels = arrays[i]
        centre = reference_centre(models[i], uploads, i, sigma)
        w = [tf.Variable(v) for v in models[i]]
        for _ in range(EPOCHS):
            for s in range(0, len(features), 10):
                with tf.GradientTape() as tape:
                    hidden = tf.nn.relu(tf.matmul(features[s : s + 10], w[0]) + w[1])
                    logits = tf.matmul(hidden, w[2]) + w[3]
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[s : s + 10], logits=logits)
                    )
                for v, g, u in zip(w, tape.gradient(loss, w), centre):
                    v.assign_sub(LR * (g + (LAMDA / ALPHA * (v - u) if proximal else 0.0)))
        models[i] = [v.numpy() for v in w]
        new_uploads.append((i, models[i]))
    return models, new_uploads


def _flat(values):
    return np.concatenate([np.ravel(np.asarray(v)) for v in values])


def run(process, arrays, rounds=ROUNDS, **kwargs):
    """The process over `rounds`, each client's private state kept between its rounds."""
    state, privates = process.initialize(), [process.initial_private_state()] * len(arrays)
    outputs = []
    for clients in rounds:
        output = process.run_round(
            state, datasets([arrays[i] for i in clients]), [privates[i] for i in clients], **kwargs
        )
        state = output.state
        for i, private in zip(clients, output.private_states):
            privates[i] = private
        outputs.append(output)
    return state, privates, outputs


# Float32 rounding of the steps (`reorder_bound`: the model's depth, 2 epochs of at most 4 batches a round, weights
# below 1 in magnitude, checked); the centre adds the distance's sum over the weights and the sum over the rows: its
# coefficients' error is at most ``alpha / sigma * max_x x e^-x * gamma(PARAMETERS)`` (< gamma), reaching the
# weights through ``lr * lamda / alpha`` (< 1) a step.
STEPS = len(ROUNDS) * EPOCHS * 4
BOUND = tolerances.reorder_bound(depth=DEPTH + PARAMETERS + CAPACITY, scale=1.0, steps=STEPS)


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_fedamp_equals_a_plain_loop(backend):
    arrays = client_arrays(seed=8)
    process = build(backend)
    assert process.simulation == backend  # The context chose the backend.
    state, privates, outputs = run(process, arrays)
    initial = [np.asarray(w) for w in process.initial_private_state().trainable]
    models, uploads = [initial] * len(arrays), []
    for clients in ROUNDS:
        models, uploads = reference_round(models, uploads, arrays, clients)
    assert tolerances.magnitude(*[_flat(m) for m in models]) <= 1.0  # The bound's scale.
    for private, want in zip(privates, models):
        np.testing.assert_allclose(_flat(private.trainable), _flat(want), rtol=0, atol=BOUND)
    # The attention matters: a sigma 10% off ends elsewhere, far beyond the bound.
    other, other_uploads = [initial] * len(arrays), []
    for clients in ROUNDS:
        other, other_uploads = reference_round(other, other_uploads, arrays, clients, sigma=1.1 * SIGMA)
    assert max(float(np.max(np.abs(_flat(a) - _flat(b)))) for a, b in zip(other, models)) > 10 * BOUND
    # The server's table: the last round's uploads in order, then empty rows.
    table = process.get_model_weights(state)
    filled = np.asarray(table.non_trainable[0])
    np.testing.assert_array_equal(filled, [1.0] * len(uploads) + [0.0] * (CAPACITY - len(uploads)))
    for row, (_, model) in enumerate(uploads):
        np.testing.assert_allclose(_flat([t[row] for t in table.trainable]), _flat(model), rtol=0, atol=BOUND)
    assert [int(o.metrics['table']['rows']) for o in outputs] == [len(r) for r in ROUNDS]
    # The proximal term matters: without it (PFLlib's clients) the models end elsewhere, far beyond the bound.
    local = [initial] * len(arrays)
    local_uploads = []
    for clients in ROUNDS:
        local, local_uploads = reference_round(local, local_uploads, arrays, clients, proximal=False)
    assert max(float(np.max(np.abs(_flat(a) - _flat(b)))) for a, b in zip(local, models)) > 100 * BOUND


def test_the_engines_round_is_its_tff_next():
    """The engine's `run_round` (its driver's table, XLA) and its TFF `next` (``federated_aggregate``, TF's kernels)
    agree, to the rounding of two instruction orders."""
    arrays = client_arrays(seed=11)
    process = build('engine')
    state, privates = process.initialize(), [process.initial_private_state()] * len(arrays)
    for clients in ROUNDS[:2]:
        data, kept = datasets([arrays[i] for i in clients]), [privates[i] for i in clients]
        ours, tffs = process.run_round(state, data, kept), process.backend.run_next(process, state, data, kept)
        table, tff_table = ours.state.global_model_weights, tffs.state.global_model_weights
        np.testing.assert_allclose(_flat(table.trainable), _flat(tff_table.trainable), rtol=0, atol=BOUND)
        np.testing.assert_array_equal(table.non_trainable[0], tff_table.non_trainable[0])
        assert ours.metrics['table'] == tffs.metrics['table']
        for a, b in zip(ours.private_states, tffs.private_states):
            np.testing.assert_allclose(_flat(a.trainable), _flat(b.trainable), rtol=0, atol=BOUND)
        state = ours.state
        for i, private in zip(clients, ours.private_states):
            privates[i] = private


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_pfllib_variant_trains_each_client_on_its_loss_alone(backend):
    arrays = client_arrays(seed=9)
    _, privates, _ = run(build(backend, variant=fedamp.PFLLIB), arrays, rounds=ROUNDS[:2])
    initial = [np.asarray(w) for w in build('per_client').initial_private_state().trainable]
    models, uploads = [initial] * len(arrays), []
    for clients in ROUNDS[:2]:
        models, uploads = reference_round(models, uploads, arrays, clients, proximal=False)
    for private, want in zip(privates, models):
        np.testing.assert_allclose(_flat(private.trainable), _flat(want), rtol=0, atol=BOUND)


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_a_non_finite_client_uploads_no_row_and_keeps_its_model(backend):
    """Round 2 with client 1's features NaN (``non_finite='ignore'``): its model stays its round-1 model, and the
    table holds the other clients' rows only, as the plain loop over them."""
    arrays = client_arrays(seed=10)
    process = build(backend)
    state, privates, _ = run(process, arrays, rounds=ROUNDS[:1])
    broken = list(arrays)
    broken[1] = (np.full_like(arrays[1][0], np.nan), arrays[1][1])
    output = process.run_round(state, datasets(broken), privates, non_finite='ignore')
    initial = [np.asarray(w) for w in process.initial_private_state().trainable]
    models, uploads = reference_round([initial] * len(arrays), [], arrays, ROUNDS[0])
    new_models, new_uploads = reference_round(models, uploads, arrays, [0, 2, 3])
    np.testing.assert_array_equal(_flat(output.private_states[1].trainable), _flat(privates[1].trainable))
    table = process.get_model_weights(output.state)
    np.testing.assert_array_equal(np.asarray(table.non_trainable[0]), [1.0, 1.0, 1.0, 0.0])
    for row, (i, model) in enumerate(new_uploads):
        np.testing.assert_allclose(_flat([t[row] for t in table.trainable]), _flat(model), rtol=0, atol=BOUND)
        np.testing.assert_allclose(_flat(output.private_states[i].trainable), _flat(new_models[i]), rtol=0, atol=BOUND)


@pytest.mark.numeric
def test_the_centre_is_pfllibs_combination():
    """`AttentionCentre.centre` (``w_i + sum_j xi_j (w_j - w_i)`` over the filled rows, its own row among them)
    equals PFLlib's formula (its own row left out), in float64, to float32 rounding."""
    rng = np.random.default_rng(0)
    models = [
        [rng.normal(size=[3, 2]).astype(np.float32) * 0.3, rng.normal(size=[2]).astype(np.float32) * 0.3]
        for _ in range(3)
    ]
    centre = fedamp.AttentionCentre(capacity=5, alpha=ALPHA, sigma=SIGMA)
    rows = [np.stack([m[k] for m in models] + [np.full_like(models[0][k], 7.0)] * 2) for k in range(2)]
    filled = np.array([1, 1, 1, 0, 0], np.float32)  # The empty rows hold garbage: they must not count.
    ours = centre.centre([tf.constant(r) for r in rows], tf.constant(filled), [tf.constant(w) for w in models[1]])
    want = reference_centre(models[1], list(enumerate(models)), 1)
    np.testing.assert_allclose(_flat(ours), _flat(want), rtol=0, atol=tolerances.reorder_bound(depth=8 + 3, scale=4.0))
    assert _flat(ours).tolist() != _flat(models[1]).tolist()  # The others' models moved it.
    empty = centre.centre([tf.constant(r) for r in rows], tf.zeros([5]), [tf.constant(w) for w in models[1]])
    np.testing.assert_array_equal(_flat(empty), _flat(models[1]))  # Before any upload: its own model.


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_fedamp_keeps_each_model_on_its_client(backend):
    process = build(backend)
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    assert process.next.type_signature.result.private_states.placement is tff.CLIENTS


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_a_round_of_more_clients_than_the_table_holds_is_refused_naming_both(backend):
    from fedpersonal import errors

    arrays = client_arrays(seed=13, sizes=(5, 6, 7, 8, 9))
    process = build(backend)
    with pytest.raises(errors.ConfigError, match='room for 4.*has 5 clients'):
        process.run_round(process.initialize(), datasets(arrays), [process.initial_private_state()] * 5)


def test_fedamp_rejects_nonsense():
    with pytest.raises(ValueError, match='variant'):
        fedamp.fedamp_plan(capacity=2, client_optimizer=tff.learning.optimizers.build_sgdm(LR), variant='other')
    with pytest.raises(ValueError, match='alpha'):
        fedamp.AttentionCentre(capacity=2, alpha=0.0)
    with pytest.raises(ValueError, match='capacity'):
        fedamp.fedamp_plan(capacity=0, client_optimizer=tff.learning.optimizers.build_sgdm(LR))


def test_fedamp_benchmark_row_keeps_a_table_of_every_client_and_scores_their_own_models(tmp_path):
    """The benchmark binary's row (`--configurations=fedamp`): its table holds a row per client, a round moves each
    client's own model (what the evaluation scores), and the row runs end to end; nonsense options are refused."""
    from fedpersonal import errors
    from fedpersonal.tasks import pfl_benchmark  # The benchmark's modules, only for this test.
    from fedpersonal.tasks import pfl_benchmark_evaluation

    small = dict(dataset='synthetic', synthetic_examples=1200, num_clients=5, state_store='memory', seeds=(0,))
    config = pfl_benchmark.PflBenchmarkConfig(**small, client_learning_rate=0.05, fedamp_variant='paper')
    bench = pfl_benchmark_evaluation.Benchmark(config, pfl_benchmark.load_data(config))
    plan, _ = pfl_benchmark.method_parts(bench, 'fedamp')
    assert plan.table.capacity == 5 and plan.phases[0].penalty is not None
    process = pfl_benchmark.build_method_process(bench, 'fedamp', plan, None)
    datasets_ = [bench.train_dataset(bench.train[c]) for c in bench.client_ids]
    initial = [process.initial_private_state()] * len(datasets_)
    output = process.run_round(process.initialize(), datasets_, initial)
    assert int(output.metrics['table']['rows']) == 5
    evaluate = pfl_benchmark_evaluation.make_evaluation(bench, plan, ())
    weights = process.get_model_weights(output.state)
    assert evaluate(weights, list(output.private_states)) != evaluate(weights, initial)
    results = pfl_benchmark.run(
        pfl_benchmark.PflBenchmarkConfig(
            **small, configurations=('fedamp',), total_rounds=2, rounds_per_eval=1, output_dir=str(tmp_path)
        )
    )
    assert [row['method'] for row in results['rows']] == ['fedamp']
    with pytest.raises(errors.ConfigError, match='fedamp_sigma'):
        pfl_benchmark.PflBenchmarkConfig(dataset='synthetic', fedamp_sigma=0.0)
