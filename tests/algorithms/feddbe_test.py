"""FedDBE (its representation bias) on both backends equals a plain loop written here (two rounds: the second
starts from each client's bias of the first), the bias stays on the clients, and it matters."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.algorithms import feddbe
from fedpersonal.privacy import audit
from tests import tolerances
from tests.algorithms.fedper_fedrep_test import client_arrays
from tests.algorithms.fedper_fedrep_test import datasets
from tests.algorithms.fedprox_lg_fedavg_test import DEPTH
from tests.algorithms.fedprox_lg_fedavg_test import HIDDEN
from tests.algorithms.fedprox_lg_fedavg_test import SPEC
from tests.algorithms.fedprox_lg_fedavg_test import keras_fn

LR, EPOCHS, ROUNDS = 0.1, 2, 2
STEPS = ROUNDS * EPOCHS * 4  # client_arrays' clients have at most 40 examples: 4 batches of 10 an epoch.
# The bias adds one term to each hidden unit's sum (DEPTH's forward fan-in), its gradient a batch's sum (in DEPTH).
BOUND = tolerances.reorder_bound(depth=DEPTH + 1, scale=1.0, steps=STEPS)  # Weights and terms of order 1.


def build(backend):
    with backends.use(backend):
        return feddbe.build_feddbe(
            keras_fn, element_spec=SPEC, client_optimizer=tff.learning.optimizers.build_sgdm(LR), client_epochs=EPOCHS
        )


def reference_round(w, biases, arrays, train_bias=True):
    """One FedDBE round by hand: each client's EPOCHS passes of SGD (batches of 10 in order) on the cross-entropy of
    ``head(relu(x W1 + b1) + bias)`` over W1, b1, the head and its bias (held fixed with `train_bias` False); then
    the example-weighted mean of the models. Returns (mean, the clients' new biases)."""
    trained, new_biases, counts = [], [], []
    for (features, labels), bias in zip(arrays, biases):
        y = [tf.Variable(v) for v in w]
        b = tf.Variable(bias)
        for _ in range(EPOCHS):
            for s in range(0, len(features), 10):
                x = features[s : s + 10]
                with tf.GradientTape() as tape:
                    z = tf.nn.relu(tf.matmul(x, y[0]) + y[1]) + b
                    logits = tf.matmul(z, y[2]) + y[3]
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels[s : s + 10], logits=logits)
                    )
                variables = y + [b] if train_bias else y
                for v, g in zip(variables, tape.gradient(loss, variables)):
                    v.assign_sub(LR * g)
        trained.append([v.numpy() for v in y])
        new_biases.append(b.numpy())
        counts.append(len(features))
    mean = [sum(n * t[k] for n, t in zip(counts, trained)) / sum(counts) for k in range(len(w))]
    return mean, new_biases


def _flat(values):
    return np.concatenate([np.ravel(np.asarray(v)) for v in values])


@pytest.mark.numeric
@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_feddbe_equals_a_plain_loop(backend):
    arrays = client_arrays(seed=8)
    process = build(backend)
    assert process.simulation == backend  # The context chose the backend.
    state = process.initialize()
    privates = [process.initial_private_state()] * len(arrays)
    w = [np.asarray(v) for v in process.get_model_weights(state).trainable]
    assert [v.shape for v in w] == [(6, HIDDEN), (HIDDEN,), (HIDDEN, 3), (3,)]  # Body and head, without the bias.
    biases = [np.asarray(p.trainable[0]) for p in privates]
    np.testing.assert_array_equal(_flat(biases), 0.0)  # Every bias starts at zero.
    for _ in range(ROUNDS):
        output = process.run_round(state, datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        w, biases = reference_round(w, biases, arrays)
    np.testing.assert_allclose(_flat(process.get_model_weights(state).trainable), _flat(w), rtol=0, atol=BOUND)
    for private, want in zip(privates, biases):
        assert len(private.trainable) == 1
        np.testing.assert_allclose(np.asarray(private.trainable[0]), want, rtol=0, atol=BOUND)


def test_the_bias_matters():
    """Two rounds with the biases trained end far beyond the bound from two with them held at zero (FedAvg), and the
    biases of different clients differ (each learns its own)."""
    arrays = client_arrays(seed=8)
    process = build('per_client')
    w0 = [np.asarray(v) for v in process.get_model_weights(process.initialize()).trainable]
    zeros = [np.zeros([HIDDEN], np.float32)] * len(arrays)
    with_bias, biases = reference_round(*reference_round(w0, zeros, arrays), arrays)
    without = reference_round(reference_round(w0, zeros, arrays, train_bias=False)[0], zeros, arrays, False)[0]
    assert np.max(np.abs(_flat(with_bias) - _flat(without))) > 10 * BOUND
    assert np.max(np.abs(biases[0] - biases[1])) > 10 * BOUND


@pytest.mark.parametrize('backend', ['engine', 'per_client'])
def test_feddbe_keeps_each_bias_on_its_client(backend):
    process = build(backend)
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    assert process.next.type_signature.result.private_states.placement is tff.CLIENTS


def test_the_bias_sits_between_a_functional_models_body_and_head():
    inputs = tf.keras.Input([3])
    hidden = tf.keras.layers.Dense(4, 'relu', kernel_initializer=tf.keras.initializers.GlorotUniform(3))(inputs)
    model = feddbe.with_representation_bias(tf.keras.Model(inputs, tf.keras.layers.Dense(2, name='head')(hidden)))
    assert [layer.name for layer in model.layers if layer.weights][-2:] == [feddbe.LAYER_NAME, 'head']
    model.get_layer(feddbe.LAYER_NAME).bias.assign([1.0, -2.0, 0.5, 3.0])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    body, head = model.layers[1], model.get_layer('head')
    want = (tf.nn.relu(x @ body.kernel + body.bias) + [1.0, -2.0, 0.5, 3.0]) @ head.kernel + head.bias
    np.testing.assert_allclose(model(x), want, rtol=1e-6)


def test_an_unbuilt_or_one_layer_model_is_refused_with_its_name():
    with pytest.raises(ValueError, match="at least two layers .* 'lonely'"):
        feddbe.with_representation_bias(tf.keras.Sequential([tf.keras.Input([3]), tf.keras.layers.Dense(2)], 'lonely'))
    with pytest.raises(ValueError, match='needs a built Keras model'):
        feddbe.with_representation_bias(tf.keras.Sequential([tf.keras.layers.Dense(2), tf.keras.layers.Dense(2)]))


def test_feddbe_benchmark_row_scores_each_client_with_its_bias(tmp_path):
    """The benchmark binary's row (`--configurations=feddbe`): the evaluation reads each client's bias (a client's
    accuracy changes with it), and the row runs end to end."""
    from fedpersonal.tasks import pfl_benchmark  # The benchmark's modules, only for this test.
    from fedpersonal.tasks import pfl_benchmark_evaluation

    small = dict(dataset='synthetic', synthetic_examples=1200, num_clients=5, state_store='memory', seeds=(0,))
    config = pfl_benchmark.PflBenchmarkConfig(**small, client_learning_rate=0.05)
    bench = pfl_benchmark_evaluation.Benchmark(config, pfl_benchmark.load_data(config))
    plan, _ = pfl_benchmark.method_parts(bench, 'feddbe')
    process = pfl_benchmark.build_method_process(bench, 'feddbe', plan, None)
    datasets_ = [bench.train_dataset(bench.train[c]) for c in bench.client_ids]
    output = process.run_round(process.initialize(), datasets_, [process.initial_private_state()] * len(datasets_))
    weights, privates = process.get_model_weights(output.state), list(output.private_states)
    assert {tuple(np.shape(p.trainable[0])) for p in privates} == {(512,)}  # PFLlib's CNN: its fc's 512 inputs.
    evaluate = pfl_benchmark_evaluation.make_evaluation(
        bench, plan, (feddbe.LAYER_NAME,), transform=feddbe.with_representation_bias
    )
    shifted = [tff.learning.models.ModelWeights([p.trainable[0] + 100.0], []) for p in privates]
    assert evaluate(weights, privates) != evaluate(weights, shifted)
    results = pfl_benchmark.run(
        pfl_benchmark.PflBenchmarkConfig(
            **small, configurations=('feddbe',), total_rounds=2, rounds_per_eval=1, output_dir=str(tmp_path)
        )
    )
    assert [row['method'] for row in results['rows']] == ['feddbe']
