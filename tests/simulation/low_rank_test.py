"""The low-rank steps of a dense model (`low_rank`): TFF's own FedAvg and the client loop compute the same rounds,
a non-finite client is dropped as there, and the phases it cannot run are left to the client loop."""

import collections
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import backends
from fedpersonal import models
from fedpersonal.simulation import client_loop
from fedpersonal.simulation import functional
from fedpersonal.simulation import low_rank
from tests import tolerances

SPEC = collections.OrderedDict(x=tf.TensorSpec([None, 40], tf.float32), y=tf.TensorSpec([None], tf.int32))
SGD = tff.learning.optimizers.build_sgdm


def _keras():
    init = lambda seed: tf.keras.initializers.GlorotUniform(seed)
    return tf.keras.Sequential(
        [
            tf.keras.Input([40]),
            tf.keras.layers.Dense(30, activation='relu', kernel_initializer=init(1), bias_initializer='ones'),
            tf.keras.layers.Dense(20, activation='tanh', kernel_initializer=init(2)),
            tf.keras.layers.Dense(3, activation='softmax', kernel_initializer=init(3), bias_initializer='ones'),
        ]
    )


def model_fn():
    keras = _keras()
    return models.from_keras_model(keras, input_spec=SPEC, global_variables=keras.variables)


def _arrays(sizes=(7, 4, 12, 2), seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=[n, 40]).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)) for n in sizes]


def _datasets(arrays):
    # Batches of 3: unequal clients (1 to 4 steps, last batches partial). The layers are large enough beside the
    # batches for the corrections to cost less than the products (`low_rank.fits`).
    return [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(3) for x, y in arrays]


def _fed_avg(strategy, momentum=None, model=model_fn):
    with backends.use('engine', strategy=strategy):
        return algorithms.build_fed_avg(
            model,
            loss_fn=tf.keras.losses.SparseCategoricalCrossentropy,
            metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy()],
            client_optimizer=SGD(0.5, momentum=momentum),
            server_optimizer=SGD(1.0),
        )


# The longest chain of additions feeding a weight in one SGD step of the 40-30-20-3 model on batches of 3: the
# forward pass's fan-ins (40 + 30 + 20), the backward pass's fan-outs (3 + 20 + 30) and the batch's gradient sum (3),
# then the mean over a round's (at most 4) clients. A round is at most 4 steps (12 examples in batches of 3).
DEPTH = 40 + 30 + 20 + 3 + 20 + 30 + 3 + 4
STEPS_PER_ROUND = 4


def _run(process, data, rounds=3):
    state, metrics = process.initialize(), []
    for r in range(rounds):
        # A round with a non-finite client goes on: its update is left out (what these tests compare).
        output = process.run_round(state, data[r % 2 :], non_finite='ignore')
        state = output.state
        metrics.append(output.metrics['client_work']['train'])
    return [np.asarray(w) for w in process.get_model_weights(state).trainable], metrics


@pytest.fixture(name='calls')
def _calls():
    """How many traced phases the low-rank steps ran."""
    original, calls = low_rank.low_rank_steps, []

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    with mock.patch.object(low_rank, 'low_rank_steps', spy):
        yield calls


@pytest.mark.numeric
def test_auto_runs_a_dense_model_low_rank_equal_to_tff_and_the_client_loop(calls):
    data = _datasets(_arrays())
    process = _fed_avg('auto')
    assert process.engine_strategy == 'low_rank'
    got, got_metrics = _run(process, data)
    assert calls  # The phase fits: the low-rank steps ran it.
    looped, loop_metrics = _run(_fed_avg('client_loop'), data)
    reference = tff.learning.algorithms.build_weighted_fed_avg(
        lambda: tff.learning.models.from_keras_model(
            _keras(), loss=tf.keras.losses.SparseCategoricalCrossentropy(), input_spec=SPEC
        ),
        client_optimizer_fn=SGD(0.5),
        server_optimizer_fn=SGD(1.0),
    )
    state = reference.initialize()
    start = [np.asarray(w) for w in reference.get_model_weights(state).trainable]
    for r in range(3):
        state = reference.next(state, data[r % 2 :]).state
    want = reference.get_model_weights(state).trainable
    assert max(float(np.abs(a - b).max()) for a, b in zip(want, start)) > 0.1  # The rounds moved the weights.
    for g, loop, w in zip(got, looped, want):  # Against TFF's runtime (no XLA) and the client loop, 3 rounds.
        tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=3 * STEPS_PER_ROUND)
        tolerances.assert_reordered_close(g, loop, depth=DEPTH, steps=3 * STEPS_PER_ROUND)
    for g, loop in zip(got_metrics, loop_metrics):
        assert g['num_examples'] == loop['num_examples']
        # The summed loss: each example's loss from the forward pass (DEPTH) and the sum over a round's examples.
        tolerances.assert_reordered_close(g['loss'], loop['loss'], depth=DEPTH + 25, steps=3 * STEPS_PER_ROUND)
        # Correct predictions are counted: equal unless a prediction sits on a tie, which these random weights and
        # inputs do not produce (the count is an integer; a flip would change it by at least one).
        np.testing.assert_array_equal(g['sparse_categorical_accuracy'], loop['sparse_categorical_accuracy'])


@pytest.mark.numeric
def test_a_non_finite_client_is_left_out_as_by_the_client_loop(calls):
    arrays = _arrays()
    arrays[1] = (np.full_like(arrays[1][0], np.inf), arrays[1][1])
    data = _datasets(arrays)
    got, _ = _run(_fed_avg('low_rank'), data, rounds=2)
    assert calls
    looped, _ = _run(_fed_avg('client_loop'), data, rounds=2)
    without, _ = _run(_fed_avg('client_loop'), _datasets(arrays[:1] + arrays[2:]), rounds=1)
    for g, loop in zip(got, looped):
        assert np.isfinite(g).all()
        tolerances.assert_reordered_close(g, loop, depth=DEPTH, steps=2 * STEPS_PER_ROUND)
    # Round 2 (clients 1-3) differs from a run without client 1 only by round 1's cohort; check round 1 alone.
    one, _ = _run(_fed_avg('low_rank'), data, rounds=1)
    for g, w in zip(one, without):
        tolerances.assert_reordered_close(g, w, depth=DEPTH, steps=STEPS_PER_ROUND)


def test_phases_it_cannot_run_are_left_to_the_client_loop(calls):
    data = _datasets(_arrays())
    got, _ = _run(_fed_avg('low_rank', momentum=0.9), data, rounds=1)  # Not plain SGD.
    want, _ = _run(_fed_avg('client_loop', momentum=0.9), data, rounds=1)
    assert not calls
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _phase(steps, batch, clients=2):
    return {'mask': tf.zeros([clients, steps, batch]), 'batch': ()}


def test_fits_reads_the_model_the_optimizer_and_the_phase():
    model = functional.FunctionalModel(model_fn, batch_norm=True)
    assert low_rank.dense_layers(model) == [((0, 0), (0, 1)), ((0, 2), (0, 3)), ((0, 4), (0, 5))]
    assert client_loop.auto_strategy(model) == 'low_rank'
    weights = functional.Parts(*[[tf.constant(v) for v in g] for g in model.initial_weights])
    train = [(0, i) for i in range(6)]
    loss = tf.keras.losses.SparseCategoricalCrossentropy()
    fits = lambda **kw: low_rank.fits(
        model,
        kw.pop('weights', weights),
        kw.pop('train', train),
        kw.pop('phase', _phase(4, 3)),
        kw.pop('optimizer', SGD(0.1)),
        kw.pop('loss', loss),
        **{'keep_trained': False, 'delta_weights': tf.ones([2]), **kw},
    )
    assert fits()
    assert not fits(keep_trained=True)  # Each client's trained weights wanted.
    assert not fits(delta_weights=None)
    assert not fits(optimizer=SGD(0.1, momentum=0.5))
    assert not fits(penalty=lambda v, c: 0.0)  # FedProx's.
    assert not fits(phase=_phase(low_rank.MAX_STEPS + 1, 3))
    assert not fits(phase=_phase(8, 64))  # Corrections would cost more than the products.
    per_client = weights._replace(global_trainable=[tf.stack([weights[0][0]] * 2)] + list(weights[0][1:]))
    assert not fits(weights=per_client)
    # Models: a convolution, a regularized kernel, an embedding, a softmax over the batch, a subclassed model.
    for layers in (
        [tf.keras.Input([6, 1]), tf.keras.layers.Conv1D(2, 2), tf.keras.layers.Flatten(), tf.keras.layers.Dense(2)],
        [tf.keras.Input([6]), tf.keras.layers.Dense(2, kernel_regularizer='l2')],
        [tf.keras.Input([6]), tf.keras.layers.Embedding(6, 2), tf.keras.layers.Flatten(), tf.keras.layers.Dense(2)],
        [tf.keras.Input([6]), tf.keras.layers.Dense(2), tf.keras.layers.Softmax(axis=0)],  # Across the examples.
    ):
        other = functional.FunctionalModel(lambda layers=layers: tf.keras.Sequential(layers))
        assert low_rank.dense_layers(other) is None
        assert client_loop.auto_strategy(other) != 'low_rank'

    class Subclassed(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x - tf.reduce_mean(x, axis=0))  # Mixes the examples of a batch.

    def subclassed():
        m = Subclassed()
        m(tf.zeros([1, 6]))
        return m

    assert low_rank.dense_layers(functional.FunctionalModel(subclassed)) is None


def _saturating_model_fn():
    init = tf.keras.initializers.GlorotUniform
    keras = tf.keras.Sequential(
        [
            tf.keras.Input([40]),
            tf.keras.layers.Dense(30, activation='relu', kernel_initializer=init(4)),
            tf.keras.layers.Dense(3, activation='softmax', kernel_initializer=init(5)),
        ]
    )
    return models.from_keras_model(keras, input_spec=SPEC, global_variables=keras.variables)


@pytest.mark.numeric
def test_a_saturated_softmax_trains_from_its_logits_as_the_client_loop(calls):
    # Inputs 30x as large: logits of hundreds, probabilities below the loss's clipping, whose gradient is zero.
    data = _datasets([(30 * x, y) for x, y in _arrays()])
    weights = {}
    for strategy in ('low_rank', 'client_loop'):
        process = _fed_avg(strategy, model=_saturating_model_fn)
        start = [np.asarray(w) for w in process.get_model_weights(process.initialize()).trainable]
        weights[strategy], _ = _run(process, data, rounds=1)
    assert calls
    assert max(float(np.abs(a - b).max()) for a, b in zip(weights['client_loop'], start)) > 1.0
    for g, w in zip(weights['low_rank'], weights['client_loop']):  # One round of the 40-30-3 model.
        tolerances.assert_reordered_close(g, w, depth=40 + 30 + 3 + 30 + 3 + 4, steps=STEPS_PER_ROUND)
