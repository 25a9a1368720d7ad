"""MOON on both backends equals a plain loop written here (two rounds: the second's contrastive term reads each
client's previous model), the previous model stays on the clients, and the term matters."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.algorithms import moon
from fedpersonal.privacy import audit
from tests import tolerances
from tests.algorithms.fedper_fedrep_test import client_arrays
from tests.algorithms.fedper_fedrep_test import datasets
from tests.algorithms.fedprox_lg_fedavg_test import DEPTH
from tests.algorithms.fedprox_lg_fedavg_test import HIDDEN
from tests.algorithms.fedprox_lg_fedavg_test import SPEC
from tests.algorithms.fedprox_lg_fedavg_test import keras_fn

LR, EPOCHS, ROUNDS, MU, TAU = 0.1, 2, 2, 2.0, 0.5
# The contrastive term adds to a step's chain of additions the representation's norms and dot products (HIDDEN
# terms each, three of them on the way to a weight's gradient); its gradient is at most MU / TAU times that of
# cosines of unit-norm vectors: the scale of a step's terms grows by MU / TAU.
MOON_DEPTH = DEPTH + 3 * HIDDEN
STEPS = ROUNDS * EPOCHS * 4  # client_arrays' clients have at most 40 examples: 4 batches of 10 an epoch.
BOUND = tolerances.reorder_bound(depth=MOON_DEPTH, scale=1.0 + MU / TAU, steps=STEPS)


def build(backend, mu=MU):
    with backends.use(backend):
        return moon.build_moon(
            keras_fn,
            element_spec=SPEC,
            client_optimizer=tff.learning.optimizers.build_sgdm(LR),
            client_epochs=EPOCHS,
            mu=mu,
            tau=TAU,
        )


def _cosine(a, b):
    unit = lambda v: v / tf.maximum(tf.norm(v, axis=1, keepdims=True), 1e-8)
    return tf.reduce_sum(unit(a) * unit(b), axis=1)


def reference_round(w, previous, arrays, mu=MU):
    """One MOON round by hand: each client's EPOCHS passes of SGD (batches of 10 in order) on the cross-entropy plus
    ``mu * mean(-log(e^(s_g/tau) / (e^(s_g/tau) + e^(s_p/tau))))``, s_g and s_p the cosines of the hidden layer's
    output with the global model's and the client's previous model's; then the example-weighted mean of the models."""
    hidden = lambda v, x: tf.nn.relu(tf.matmul(x, v[0]) + v[1])
    trained, counts = [], []
    for (features, labels), old in zip(arrays, previous):
        y = [tf.Variable(v) for v in w]
        for _ in range(EPOCHS):
            for s in range(0, len(features), 10):
                x = features[s : s + 10]
                with tf.GradientTape() as tape:
                    z = hidden(y, x)
                    logits = tf.matmul(z, y[2]) + y[3]
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[s : s + 10], logits=logits)
                    )
                    to_global, to_previous = _cosine(z, hidden(w, x)), _cosine(z, hidden(old, x))
                    ratio = tf.exp(to_global / TAU) / (tf.exp(to_global / TAU) + tf.exp(to_previous / TAU))
                    loss += mu * tf.reduce_mean(-tf.math.log(ratio))
                for v, g in zip(y, tape.gradient(loss, y)):
                    v.assign_sub(LR * g)
        trained.append([v.numpy() for v in y])
        counts.append(len(features))
    mean = [sum(n * t[k] for n, t in zip(counts, trained)) / sum(counts) for k in range(len(w))]
    return mean, trained


def _flat(values):
    return np.concatenate([np.ravel(np.asarray(v)) for v in values])


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_moon_equals_a_plain_loop(backend):
    arrays = client_arrays(seed=8)
    process = build(backend)
    assert process.simulation == backend  # The context chose the backend.
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    w = [np.asarray(v) for v in process.get_model_weights(state).trainable]
    previous = [[np.asarray(v) for v in p.trainable] for p in privates]
    np.testing.assert_array_equal(_flat(previous[0]), _flat(w))  # The previous model starts as the initial one.
    for _ in range(ROUNDS):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        w, previous = reference_round(w, previous, arrays)
    ours = process.get_model_weights(state).trainable
    np.testing.assert_allclose(_flat(ours), _flat(w), rtol=0, atol=BOUND)
    for private, want in zip(privates, previous):
        np.testing.assert_allclose(_flat(private.trainable), _flat(want), rtol=0, atol=BOUND)


def test_the_contrastive_term_matters():
    """Round 2 without the term (mu = 0, FedAvg) ends far beyond the bound from MOON's (round 1 alone does not: the
    previous and the global model are the same initial one, and the term's gradient is zero)."""
    arrays = client_arrays(seed=8)
    w0 = [np.asarray(v) for v in build('per_client').get_model_weights(build('per_client').initialize()).trainable]
    first, previous = reference_round(w0, [w0] * len(arrays), arrays)
    np.testing.assert_allclose(_flat(first), _flat(reference_round(w0, [w0] * 4, arrays, mu=0.0)[0]), atol=1e-6)
    with_term = reference_round(first, previous, arrays)[0]
    without = reference_round(first, previous, arrays, mu=0.0)[0]
    assert np.max(np.abs(_flat(with_term) - _flat(without))) > 10 * BOUND


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_a_non_finite_client_is_left_out_and_keeps_its_previous_model(backend):
    """Round 2 with one client's features NaN (``non_finite='ignore'``): the model is the other clients' mean, as
    the plain loop over them, and that client keeps its previous model from round 1."""
    arrays = client_arrays(seed=9)
    process = build(backend)
    state = process.initialize()
    w = [np.asarray(v) for v in process.get_model_weights(state).trainable]
    output = process.run_round(state, datasets(arrays), [process.initial_private_state()] * len(arrays))
    w, previous = reference_round(w, [w] * len(arrays), arrays)
    broken = list(arrays)
    broken[1] = (np.full_like(arrays[1][0], np.nan), arrays[1][1])
    second = process.run_round(output.state, datasets(broken), list(output.private_states), non_finite='ignore')
    finite = [0, 2, 3]
    w, new_previous = reference_round(w, [previous[i] for i in finite], [arrays[i] for i in finite])
    np.testing.assert_allclose(_flat(process.get_model_weights(second.state).trainable), _flat(w), rtol=0, atol=BOUND)
    privates = list(second.private_states)
    np.testing.assert_array_equal(_flat(privates[1].trainable), _flat(output.private_states[1].trainable))
    for i, want in zip(finite, new_previous):
        np.testing.assert_allclose(_flat(privates[i].trainable), _flat(want), rtol=0, atol=BOUND)


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_moon_keeps_each_previous_model_on_its_client(backend):
    process = build(backend)
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    assert process.next.type_signature.result.private_states.placement is tff.CLIENTS


def test_the_representation_of_a_functional_model_is_its_last_layers_input():
    inputs = tf.keras.Input([3])
    hidden = tf.keras.layers.Dense(4, 'relu', kernel_initializer=tf.keras.initializers.GlorotUniform(3))(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(hidden))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = tf.nn.relu(x @ model.layers[1].kernel + model.layers[1].bias)
    np.testing.assert_array_equal(moon.last_layer_input(model, x), want)


def test_moon_rejects_nonsense_options():
    with pytest.raises(ValueError, match='tau > 0'):
        moon.Contrast(mu=1.0, tau=0.0)
    with pytest.raises(ValueError, match='mu >= 0'):
        moon.Contrast(mu=-1.0, tau=0.5)


def test_moon_benchmark_row_scores_the_global_model(tmp_path):
    """The benchmark binary's row (`--configurations=moon`): its evaluation of the server's weights and the clients'
    previous models is FedAvg's evaluation of the global model alone; the row runs end to end."""
    from fedpersonal.tasks import pfl_benchmark  # The benchmark's modules, only for this test.
    from fedpersonal.tasks import pfl_benchmark_evaluation
    from fedpersonal.tasks import pfl_benchmark_methods

    small = dict(dataset='synthetic', synthetic_examples=1200, num_clients=5, state_store='memory', seeds=(0,))
    config = pfl_benchmark.PflBenchmarkConfig(**small, client_learning_rate=0.05)
    bench = pfl_benchmark_evaluation.Benchmark(config, pfl_benchmark.load_data(config))
    plan, _ = pfl_benchmark.method_parts(bench, 'moon')
    process = pfl_benchmark.build_method_process(bench, 'moon', plan, None)
    datasets_ = [bench.train_dataset(bench.train[c]) for c in bench.client_ids]
    output = process.run_round(process.initialize(), datasets_, [process.initial_private_state()] * len(datasets_))
    weights = process.get_model_weights(output.state)
    got = pfl_benchmark_evaluation.make_evaluation(bench, plan, ())(weights, list(output.private_states))
    fedavg = pfl_benchmark_methods.METHOD_SPECS['fedavg'].plan(config)
    want = pfl_benchmark_evaluation.make_evaluation(bench, fedavg, ())(
        weights, [tff.learning.models.ModelWeights([], [])] * 5
    )
    assert got == want
    results = pfl_benchmark.run(
        pfl_benchmark.PflBenchmarkConfig(
            **small, configurations=('moon',), total_rounds=2, rounds_per_eval=1, output_dir=str(tmp_path)
        )
    )
    assert [row['method'] for row in results['rows']] == ['moon']


def test_the_benchmark_refuses_a_nonsense_temperature():
    from fedpersonal import errors
    from fedpersonal.tasks import pfl_benchmark_config

    with pytest.raises(errors.ConfigError, match='moon_tau'):
        pfl_benchmark_config.PflBenchmarkConfig(dataset='synthetic', moon_tau=0.0)


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_moon_refuses_a_model_with_weights_that_are_not_global_and_trainable(backend):
    """The representations run at weight lists: a batch norm's moving statistics (non-trainable) are refused with a
    message, not a trace from inside TF."""

    def with_batch_norm():
        return tf.keras.Sequential(
            [
                tf.keras.Input([6]),
                tf.keras.layers.Dense(8),
                tf.keras.layers.BatchNormalization(),
                tf.keras.layers.Dense(3),
            ]
        )

    with pytest.raises(ValueError, match='all global and trainable'), backends.use(backend):
        moon.build_moon(with_batch_norm, element_spec=SPEC, client_optimizer=tff.learning.optimizers.build_sgdm(LR))
