"""The composer's optional post-aggregation stage on a toy stateful process (scalar model, scalar private state).

Round: the server's w is broadcast, client i (data x_i, private p_i) uploads ``update = w - mean(x_i)`` with
weight 1 and keeps ``p_i + mean(x_i)``; TFF's mean and SGD(1) give ``w' = mean_i mean(x_i)``. The post stage
broadcasts ``2 w'`` and sets ``p_i <- p_i + 2 w' + metric_i`` (metric_i = mean(x_i)), which the test computes by hand.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import core
from tests import tolerances

DATA = [np.array([1.0, 3.0], np.float32), np.array([4.0, 6.0], np.float32), np.array([10.0, 20.0], np.float32)]


@tff.tensorflow.computation
def initial_weights():
    return tff.learning.models.ModelWeights(trainable=[tf.constant(0.5)], non_trainable=[])


@tff.tensorflow.computation
def initial_private():
    return tf.constant(0.0)


WEIGHTS = initial_weights.type_signature.result


@tff.tensorflow.computation(WEIGHTS, tff.TensorType(np.float32, [2]), np.float32)
def client_update(weights, x, private):
    mean = tf.reduce_mean(x)
    result = tff.learning.templates.ClientResult(update=[weights.trainable[0] - mean], update_weight=1.0)
    return result, collections.OrderedDict(mean=tf.stack([mean, 1.0])), private + mean


METRICS = client_update.type_signature.result[1]


@tff.tensorflow.computation(WEIGHTS)
def doubled(weights):
    return 2.0 * weights.trainable[0]


@tff.tensorflow.computation(np.float32, np.float32, METRICS)
def add_broadcast(value, private, metrics):
    return private + value + metrics['mean'][0]


def build(post_aggregation=None):
    return core.compose_personalized_process(
        initial_global_weights=initial_weights,
        initial_private_state=initial_private,
        client_update=client_update,
        aggregate_metrics=core.ratio_metrics(),
        server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
        post_aggregation=post_aggregation,
    )


def test_post_aggregation_broadcasts_the_new_weights_and_updates_private_states():
    plain, staged = build(), build(core.PostAggregation(server_value=doubled, client_update=add_broadcast))
    assert staged.parts['post_aggregation'].client_update is add_broadcast
    private = [np.float32(p) for p in (1.0, 2.0, 3.0)]
    before, after = plain.next(plain.initialize(), DATA, private), staged.next(staged.initialize(), DATA, private)
    means = [float(np.mean(x)) for x in DATA]
    new_w = float(np.mean(means))
    # The means and their sums are small integers, exact in float32; w' = 22 / 3 is not: float32 rounds the mean's
    # division, the server step and the post stage's two additions (at most 4 roundings of 2**-24, relative).
    rel = 4 * tolerances.U32
    for out in (before, after):  # The stage changes neither the server step nor the metrics.
        assert out.state.global_model_weights.trainable[0] == pytest.approx(new_w, rel=rel)
        assert out.metrics['client_work']['train']['mean'] == pytest.approx(new_w, rel=rel)
    assert list(before.private_states) == [p + m for p, m in zip(private, means)]  # Integers: exact.
    assert list(after.private_states) == pytest.approx([p + m + 2 * new_w + m for p, m in zip(private, means)], rel=rel)


def test_without_the_stage_the_round_has_one_broadcast():
    def broadcasts(process):
        return str(process.next.to_building_block()).count('federated_broadcast')

    assert broadcasts(build(core.PostAggregation(doubled, add_broadcast))) == broadcasts(build()) + 1


def test_post_aggregation_needs_private_states():
    with pytest.raises(ValueError, match='needs initial_private_state'):
        core.compose_personalized_process(
            initial_global_weights=initial_weights,
            client_update=client_update,
            aggregate_metrics=core.ratio_metrics(),
            server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
            post_aggregation=core.PostAggregation(doubled, add_broadcast),
        )
