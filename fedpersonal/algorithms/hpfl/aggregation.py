"""HPFL's aggregation and personalization formulas, and FedAtt's attentive aggregation as a `tff.aggregators` factory.

* `public_aggregation_weights`: a_k = d(Acc_k, p) I_k Acc_k (the accuracy-weighted public aggregation);
* `personalize_public`: c_k <- c_k Acc_k + c_k^g (1 - Acc_k);
* `global_embedding` / `personalize_embeddings`: the fine-grained update of user/item rows towards the global
  centres Theta^g;
* `AttentionMeanFactory`: FedAtt's layer-wise softmax(-distance) mean of client updates.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms.hpfl.clustering import squared_distances
from fedpersonal.algorithms.hpfl.types import CENTER_WEIGHTINGS
from fedpersonal.models import gum

_EPS = 1e-6


def public_aggregation_weights(attribute_accuracy, attribute_iterations, threshold: float):
    """``a_k = d(Acc_k, p) I_k Acc_k`` with ``d(x, p) = 1 if x > p else 0`` (``[K]``)."""
    passed = tf.cast(attribute_accuracy > threshold, tf.float32)
    return passed * attribute_iterations * attribute_accuracy


def personalize_public(
    local: gum.PublicWeights, global_public: gum.PublicWeights, attribute_accuracy
) -> gum.PublicWeights:
    """``c_k <- c_k Acc_k + c_k^g (1 - Acc_k)`` for every attribute k (row k of each public matrix)."""
    acc = attribute_accuracy[:, None]
    return gum.PublicWeights(*[acc * mine + (1.0 - acc) * shared for mine, shared in zip(local, global_public)])


def global_embedding(embeddings, centres, centre_mask, weighting: str = 'distance'):
    """``Emb^g = sum_n w_n Theta_n / sum_m w_m`` per row over the valid centres (``[n, d]``).

    ``w_n = ||Emb - Theta_n||`` (``'distance'``, as published) or ``1 / ||Emb - Theta_n||``
    (``'inverse_distance'``, distances floored at 1e-6). A row whose weights sum to 0 (it coincides with every
    centre) gets ``Emb^g = Emb``.
    """
    if weighting not in CENTER_WEIGHTINGS:
        raise ValueError(f'center_weighting must be one of {CENTER_WEIGHTINGS}, got {weighting!r}.')
    distance = tf.sqrt(squared_distances(embeddings, centres))
    mask = tf.cast(centre_mask, tf.float32)[None, :]
    weights = mask * (distance if weighting == 'distance' else 1.0 / tf.maximum(distance, _EPS))
    total = tf.reduce_sum(weights, axis=1, keepdims=True)
    return tf.where(total > 0, tf.math.divide_no_nan(tf.matmul(weights, centres), total), embeddings)


def personalize_embeddings(embeddings, row_mask, centres, centre_mask, accuracy, weighting: str = 'distance'):
    """``Emb_j <- Emb_j Acc + Emb^g (1 - Acc)`` for the rows where `row_mask` is set (others unchanged; all
    unchanged when there is no valid centre)."""
    blended = accuracy * embeddings + (1.0 - accuracy) * global_embedding(embeddings, centres, centre_mask, weighting)
    update = tf.logical_and(tf.cast(row_mask, tf.bool), tf.reduce_any(tf.cast(centre_mask, tf.bool)))
    return tf.where(update[:, None], blended, embeddings)


def attention_upload(update, mask):
    """A client's FedAtt upload: ``([s_l u_l], [s_l])`` with ``s_l = exp(-||u_l||) m`` per tensor l."""
    scores = [tf.exp(-tf.norm(u)) * mask for u in update]
    return [s * u for s, u in zip(scores, update)], scores


def divide_attention(sums):
    """FedAtt's server division of the summed uploads: ``sum_i alpha_il u_il`` per tensor l."""
    weighted, scores = sums
    return [tf.math.divide_no_nan(w, s) for w, s in zip(weighted, scores)]


class AttentionMeanFactory(tff.aggregators.WeightedAggregationFactory):
    """FedAtt's attentive aggregation (Ji et al. 2019) of client updates, per tensor ("layer") l.

    A client with update ``u_il = w_l - w_il`` (server weights minus its trained weights) and weight ``m_i``
    uploads ``s_il u_il`` and ``s_il`` with ``s_il = exp(-||u_il||) m_i``; the sums (`tff.aggregators.SumFactory`,
    or `inner_factory`) give the server ``sum_i alpha_il u_il`` with ``alpha_il = softmax_i(-||u_il||)`` over the
    clients with ``m_i > 0``. ``m_i`` is a mask (1, or 0 for a client whose update is not finite), not an example
    count. With an SGD server step of learning rate eps this is ``w_l <- w_l - eps sum_i alpha_il (w_l - w_il)``.
    (``exp(-d)`` underflows in float32 for d > ~87, far above one round's update norms here.)
    """

    def __init__(self, inner_factory: tff.aggregators.UnweightedAggregationFactory | None = None):
        self._inner_factory = inner_factory or tff.aggregators.SumFactory()

    def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
        value_type = tff.to_type(value_type)
        weight_type = tff.to_type(weight_type)

        @tff.tensorflow.computation(value_type, weight_type)
        def scored(update, mask):
            return attention_upload(update, mask)

        inner = self._inner_factory.create(scored.type_signature.result)

        @tff.tensorflow.computation(scored.type_signature.result)
        def attention_mean(sums):
            return divide_attention(sums)

        @tff.federated_computation
        def initialize():
            return inner.initialize()

        @tff.federated_computation(
            initialize.type_signature.result,
            tff.FederatedType(value_type, tff.CLIENTS),
            tff.FederatedType(weight_type, tff.CLIENTS),
        )
        def next_fn(state, value, weight):
            summed = inner.next(state, tff.federated_map(scored, (value, weight)))
            return tff.templates.MeasuredProcessOutput(
                state=summed.state,
                result=tff.federated_map(attention_mean, summed.result),
                measurements=summed.measurements,
            )

        return tff.templates.AggregationProcess(initialize, next_fn)
