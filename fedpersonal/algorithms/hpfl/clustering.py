"""The deterministic TF k-means of HPFL's clients and server: maximin initialization, then Lloyd iterations.

TFF's `tff.learning.algorithms.build_fed_kmeans` does not fit HPFL's clustering: it is mini-batch (Sculley) k-means
that moves randomly initialized centroids one step per round with cumulative counts, while HPFL needs, every round,
a clustering of that round's points (a client's embeddings, or all uploaded centres at the server). Points are
padded to static shapes with a mask; so are the centres.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def squared_distances(points, centres):
    """``[n, m]`` squared Euclidean distances (expanded form, clipped at 0)."""
    d2 = (
        tf.reduce_sum(tf.square(points), 1)[:, None]
        - 2.0 * tf.matmul(points, centres, transpose_b=True)
        + tf.reduce_sum(tf.square(centres), 1)[None, :]
    )
    return tf.maximum(d2, 0.0)


def maximin_init(points, mask, num_clusters, max_clusters: int):
    """Deterministic k-means initialization: the valid point nearest the valid points' mean, then repeatedly the
    valid point farthest from the chosen ones (ties: lowest index).

    Args:
      points: float32 ``[n, d]``.
      mask: ``[n]`` (bool or 1/0) valid points.
      num_clusters: int32 scalar, the wanted number of clusters (capped to `max_clusters` and to the number of
        valid points).
      max_clusters: Static number of centre slots.

    Returns:
      ``(centres [max_clusters, d], centre_mask [max_clusters] float32)``; unused slots are zero and masked.
    """
    points = tf.convert_to_tensor(points, tf.float32)
    valid = tf.cast(mask, tf.bool)
    num_valid = tf.reduce_sum(tf.cast(valid, tf.int32))
    k = tf.minimum(tf.minimum(tf.cast(num_clusters, tf.int32), max_clusters), num_valid)
    fvalid = tf.cast(valid, tf.float32)[:, None]
    mean = tf.reduce_sum(points * fvalid, 0) / tf.maximum(tf.reduce_sum(fvalid), 1.0)
    inf = tf.constant(np.inf, tf.float32)
    to_mean = tf.where(valid, tf.reduce_sum(tf.square(points - mean), 1), inf)
    first = tf.argmin(to_mean, output_type=tf.int32)
    dim = tf.shape(points)[1]
    centres = tf.zeros([max_clusters, dim])
    centres = tf.where(k > 0, tf.tensor_scatter_nd_update(centres, [[0]], tf.gather(points, first[None])), centres)
    nearest = tf.where(valid, tf.reduce_sum(tf.square(points - tf.gather(points, first)), 1), -inf)

    def body(t, centres, nearest):
        chosen = tf.argmax(nearest, output_type=tf.int32)
        take = t < k
        centres = tf.where(take, tf.tensor_scatter_nd_update(centres, [[t]], tf.gather(points, chosen[None])), centres)
        nearest = tf.where(
            take, tf.minimum(nearest, tf.reduce_sum(tf.square(points - tf.gather(points, chosen)), 1)), nearest
        )
        return t + 1, centres, nearest

    _, centres, _ = tf.while_loop(lambda t, *_: t < max_clusters, body, (tf.constant(1), centres, nearest))
    return centres, tf.cast(tf.range(max_clusters) < k, tf.float32)


def lloyd_step(points, mask, centres, centre_mask):
    """One Lloyd iteration: assign each valid point to its nearest valid centre, move each valid centre to the mean
    of its points (an empty cluster keeps its centre). Returns ``(centres, assignment [n] int32)``."""
    points = tf.convert_to_tensor(points, tf.float32)
    valid_centre = tf.cast(centre_mask, tf.bool)
    d2 = tf.where(valid_centre[None, :], squared_distances(points, centres), np.inf)
    assignment = tf.argmin(d2, axis=1, output_type=tf.int32)
    members = tf.one_hot(assignment, tf.shape(centres)[0]) * tf.cast(mask, tf.float32)[:, None]
    counts = tf.reduce_sum(members, 0)
    means = tf.matmul(members, points, transpose_a=True) / tf.maximum(counts, 1.0)[:, None]
    moved = tf.logical_and(counts > 0, valid_centre)
    return tf.where(moved[:, None], means, centres), assignment


def kmeans(points, mask, num_clusters, max_clusters: int, iterations: int = 10):
    """`maximin_init` then `iterations` `lloyd_step`s. Returns ``(centres, centre_mask, assignment)``."""
    centres, centre_mask = maximin_init(points, mask, num_clusters, max_clusters)
    assignment = tf.zeros([tf.shape(points)[0]], tf.int32)
    for _ in range(iterations):
        centres, assignment = lloyd_step(points, mask, centres, centre_mask)
    return centres, centre_mask, assignment


def cluster_count(num_points, divisor: int, maximum: int):
    """``min(num_points // divisor + 1, maximum)``, 0 without points."""
    num_points = tf.cast(num_points, tf.int32)
    return tf.where(num_points > 0, tf.minimum(num_points // divisor + 1, maximum), 0)
