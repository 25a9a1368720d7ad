"""The composer's optional server step and custom distributor on a toy stateful process, checked by hand.

Round: the distributor sends nothing (its state counts rounds); client i (data x_i, private p_i) uploads
``mean(x_i)`` (not a `ClientResult`) and keeps ``p_i + 1``; the server step sets the weight to the sum of the
uploads and adds the number of clients to its state; the post stage broadcasts ``weight + state`` and adds it to
every private state.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import core
from tests import tolerances

DATA = [np.array([1.0, 3.0], np.float32), np.array([4.0, 6.0], np.float32), np.array([10.0, 20.0], np.float32)]
ROUND = tff.TensorType(np.int32)


@tff.tensorflow.computation
def initial_weights():
    return tff.learning.models.ModelWeights(trainable=[tf.constant(0.5)], non_trainable=[])


WEIGHTS = initial_weights.type_signature.result


@tff.tensorflow.computation(ROUND)
def increment(count):
    return count + 1


@tff.federated_computation(tff.FederatedType(ROUND, tff.SERVER), tff.FederatedType(WEIGHTS, tff.SERVER))
def send_nothing(count, weights):
    del weights
    return tff.templates.MeasuredProcessOutput(
        state=tff.federated_map(increment, count),
        result=tff.federated_value((), tff.CLIENTS),
        measurements=tff.federated_value((), tff.SERVER),
    )


DISTRIBUTOR = tff.learning.templates.DistributionProcess(
    tff.federated_computation(lambda: tff.federated_value(np.int32(0), tff.SERVER)), send_nothing
)


@tff.tensorflow.computation(tff.StructType([]), tff.TensorType(np.float32, [2]), np.float32)
def client_update(received, x, private):
    del received
    mean = tf.reduce_mean(x)
    return mean, collections.OrderedDict(mean=tf.stack([mean, 1.0])), private + 1.0


@tff.tensorflow.computation(np.float32)
def as_weights(total):
    return tff.learning.models.ModelWeights(trainable=[total], non_trainable=[])


@tff.tensorflow.computation(np.float32, np.int32)
def add_count(state, count):
    return state + tf.cast(count, tf.float32)


def server_next(state, weights, uploads, client_metrics):
    del weights, client_metrics
    count = tff.federated_sum(tff.federated_value(1, tff.CLIENTS))
    measurements = collections.OrderedDict(clients=count)
    return (
        tff.federated_map(as_weights, tff.federated_sum(uploads)),
        tff.federated_map(add_count, (state, count)),
        (measurements),
    )


STEP = core.ServerStep(tff.federated_computation(lambda: tff.federated_value(np.float32(0.0), tff.SERVER)), server_next)


@tff.tensorflow.computation(WEIGHTS, np.float32)
def weight_plus_state(weights, state):
    return weights.trainable[0] + state


@tff.tensorflow.computation(np.float32, np.float32, client_update.type_signature.result[1])
def add_value(value, private, metrics):
    del metrics
    return private + value


def build(**kwargs):
    return core.compose_personalized_process(
        initial_global_weights=initial_weights,
        initial_private_state=tff.tensorflow.computation(lambda: tf.constant(0.0)),
        client_update=client_update,
        aggregate_metrics=core.ratio_metrics(),
        model_distributor=DISTRIBUTOR,
        server_step=STEP,
        **kwargs,
    )


def test_server_step_replaces_aggregator_and_finalizer():
    process = build(client_metrics_key=None)
    private = [np.float32(p) for p in (1.0, 2.0, 3.0)]
    out = process.next(process.initialize(), DATA, private)
    means = [float(np.mean(x)) for x in DATA]
    # The means (2, 5, 15), their sum and the private states are small integers: exact in float32.
    assert out.state.global_model_weights.trainable[0] == sum(means)
    assert out.state.aggregator == 3.0 and out.state.finalizer == () and out.state.distributor == 1
    assert list(out.metrics) == ['distributor', 'client_work', 'clients']
    # 22 / 3: one float32 rounding of the division.
    assert out.metrics['client_work']['mean'] == pytest.approx(np.mean(means), rel=tolerances.U32)
    assert out.metrics['clients'] == 3
    assert list(out.private_states) == [p + 1 for p in private]
    assert 'federated_broadcast' not in str(process.next.to_building_block())  # The distributor sends nothing.
    assert 'train' in build().next(process.initialize(), DATA, private).metrics['client_work']  # TFF's key.


def test_post_aggregation_receives_the_new_weights_and_server_state():
    process = build(post_aggregation=core.PostAggregation(weight_plus_state, add_value))
    private = [np.float32(p) for p in (1.0, 2.0, 3.0)]
    out = process.next(process.initialize(), DATA, private)
    value = sum(float(np.mean(x)) for x in DATA) + 3.0
    assert list(out.private_states) == [p + 1 + value for p in private]  # Small integers: exact.


def test_after_client_work_is_the_round_from_the_uploads():
    process = build()
    state_type = process.initialize.type_signature.result

    @tff.federated_computation(
        state_type,
        tff.FederatedType(np.float32, tff.CLIENTS),
        tff.FederatedType(client_update.type_signature.result[1], tff.CLIENTS),
        tff.FederatedType(np.float32, tff.CLIENTS),
    )
    def round_from_uploads(state, uploads, metrics, private):
        return process.parts['after_client_work'](state, uploads, metrics, private)

    metrics = [collections.OrderedDict(mean=np.array([u, 1.0], np.float32)) for u in (2.0, 5.0)]
    out = round_from_uploads(process.initialize(), [2.0, 5.0], metrics, [1.0, 1.0])
    assert out.state.global_model_weights.trainable[0] == 7.0  # 2 + 5, exact.
    assert out.state.aggregator == 2.0 and out.state.distributor == 0  # No distributor ran.


def test_server_step_needs_private_states():
    with pytest.raises(ValueError, match='server_step is a part of stateful client work'):
        core.compose_personalized_process(
            initial_global_weights=initial_weights,
            client_update=client_update,
            aggregate_metrics=core.ratio_metrics(),
            server_step=STEP,
        )
