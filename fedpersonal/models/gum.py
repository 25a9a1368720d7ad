"""The General User Model (GUM) of HPFL (Wu et al., WWW 2021) as pure TensorFlow functions of (weights, batch).

Weights (`GumWeights`) are plain tensors, no Keras layers or variables, so that TFF computations can move them
between placements, train them in `tf.data.Dataset.reduce` loops and aggregate them component by component.

**Public components** (`PublicWeights`, shareable between clients; the authors' code names):

* ``skill_W`` ``[K, h]``: maps a user's attribute-masked embedding to an h-dimensional skill representation;
* ``know_W`` ``[K, h]``: maps an item's attribute-masked difficulty to an h-dimensional knowledge requirement;
* ``relative_M`` ``[K, K]`` (identity at initialization): relations between attributes; an item with attribute
  row ``q`` (multi-hot ``[K]``) involves the attributes ``q M``.

**Private components** (`PrivateWeights`, one table row per user or item of the client, never shared raw):

* ``theta`` ``[max_users, K]``: user embedding (one coordinate per attribute: `user_proficiency`);
* ``difficulty`` ``[max_items, K]``: item difficulty b;
* ``discrimination`` ``[max_items]``: item discrimination w (fixed at ``discrimination_init`` and not trained when
  ``GumConfig.use_discrimination`` is False);
* ``slip`` and ``guess`` ``[max_items]``: slip s and guess g.

Tables are padded to ``max_users``/``max_items`` (the largest silo) so that every client has the same static TFF
type; rows past a silo's ``num_users``/``num_items`` are never read by its data and are masked out of clustering.

**Prediction** for user u and item e with attribute row q, as in the paper (and the authors' code)::

    x = (sigmoid((theta_u * q M) skill_W) - sigmoid((b_e * q M) know_W)) * w_e        (h-dimensional)
    y = sigmoid((1 - sigmoid(s_e - 1)) * x + sigmoid(g_e - 1) * (1 - x))

The publication leaves the reduction of the h-dimensional x to one score implicit; here x is averaged over its h
coordinates before the slip/guess step (with h = 1 this is the formula verbatim). The outer sigmoid is the authors'
(a DINA-style ``(1 - S) x + G (1 - x)`` would not have one). **Range**: with S = sigmoid(s - 1), G = sigmoid(g - 1)
and |x| <= |w| (the mean of differences of sigmoids lies in (-1, 1)), y = sigmoid((1 - S - G) x + G) lies in
``[sigmoid(G - |1 - S - G| |w|), sigmoid(G + |1 - S - G| |w|)]``, inside (0, 1); at initialization (s = g = 0,
w = ``discrimination_init`` = 1) that is about [0.45, 0.68], so the model reaches confident predictions only by
learning a larger discrimination (or slip/guess). The loss is the mean squared error against the label in [0, 1].

**Labels**: the binary task (ASSIST) uses the 0/1 correctness as is. The rating task (MovieLens) maps a rating r
in ``[lo, hi]`` = ``rating_range`` to ``(r - lo) / (hi - lo)`` in [0, 1] for training (`to_unit`) and maps
predictions back with ``lo + y (hi - lo)`` (`from_unit`) for metrics; rating accuracy compares the rounded,
clipped back-mapped prediction with the true rating (the paper's MovieLens ACC).

**Per-attribute knowledge vector** c_k (the unit of HPFL's public aggregation): the concatenation
``[skill_W[k, :], know_W[k, :], relative_M[k, :]]`` of length ``2 h + K`` (`attribute_vectors`). Row k of each
public matrix is what attribute k owns: row k of ``relative_M`` only receives gradient from items that have
attribute k (``q M = sum_k q_k M[k, :]``), and rows k of ``skill_W``/``know_W`` weigh the k-th coordinate of the
attribute-masked user/item inputs. The K vectors together are exactly the public model
(`from_attribute_vectors` inverts `attribute_vectors`), so aggregating every attribute aggregates all of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from fedpersonal import errors

__all__ = [
    'GumConfig',
    'GumConfigError',
    'PublicWeights',
    'PrivateWeights',
    'GumWeights',
    'TASKS',
    'initial_public',
    'initial_private',
    'initial_weights',
    'predict',
    'mse_loss',
    'correct',
    'to_unit',
    'from_unit',
    'attribute_vectors',
    'from_attribute_vectors',
    'attribute_vector_size',
    'user_proficiency',
    'trainable_private_fields',
]

TASKS = ('binary', 'rating')


class GumConfigError(errors.ConfigError):
    """An invalid GUM configuration (the message names the field)."""


@dataclasses.dataclass(frozen=True)
class GumConfig:
    """Static shapes and options of a GUM shared by every client.

    Attributes:
      num_attributes: K, the number of item attributes (ASSIST concepts, MovieLens genres).
      max_users: Rows of the user table (the largest silo's number of users).
      max_items: Rows of the item tables (the largest silo's number of items).
      hidden_dim: h, the width of the skill/knowledge representations.
      task: 'binary' (0/1 labels) or 'rating' (labels in `rating_range`, mapped to [0, 1]).
      rating_range: (lo, hi) of the labels; (0, 1) for the binary task.
      use_discrimination: Train the item discrimination w (otherwise w stays at `discrimination_init`).
      embedding_init_stddev: Standard deviation of the normal initialization of theta and b.
      discrimination_init: Initial value of every w.
    """

    num_attributes: int
    max_users: int
    max_items: int
    hidden_dim: int = 16
    task: str = 'binary'
    rating_range: tuple[float, float] = (0.0, 1.0)
    use_discrimination: bool = True
    embedding_init_stddev: float = 0.1
    discrimination_init: float = 1.0

    def __post_init__(self):
        for name in ('num_attributes', 'max_users', 'max_items', 'hidden_dim'):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise GumConfigError(f'GumConfig.{name} must be a positive int, got {value!r}.')
        if self.task not in TASKS:
            raise GumConfigError(f'GumConfig.task must be one of {TASKS}, got {self.task!r}.')
        lo, hi = (float(v) for v in self.rating_range)
        if not hi > lo:
            raise GumConfigError(f'GumConfig.rating_range must be (lo, hi) with hi > lo, got {self.rating_range!r}.')
        if self.task == 'binary' and (lo, hi) != (0.0, 1.0):
            raise GumConfigError(
                f'GumConfig.rating_range must be (0, 1) for the binary task, got {self.rating_range!r}.'
            )
        if self.embedding_init_stddev < 0:
            raise GumConfigError(f'GumConfig.embedding_init_stddev must be >= 0, got {self.embedding_init_stddev!r}.')
        object.__setattr__(self, 'rating_range', (lo, hi))

    @classmethod
    def for_data(cls, data: Any, **kwargs) -> GumConfig:
        """A config sized for a `fedpersonal.data.user_modeling.UserModelingData` (K, largest silo, task, range)."""
        if not data.silos:
            raise GumConfigError(f'{data.name}: the data set has no client silos.')
        return cls(
            num_attributes=int(data.num_attributes),
            max_users=max(int(s.num_users) for s in data.silos),
            max_items=max(int(s.num_items) for s in data.silos),
            task=data.task,
            rating_range=tuple(data.rating_range),
            **kwargs,
        )


class PublicWeights(NamedTuple):
    """Public (shareable) components of a GUM."""

    skill_W: Any  # [K, h]  # pylint: disable=invalid-name
    know_W: Any  # [K, h]  # pylint: disable=invalid-name
    relative_M: Any  # [K, K]  # pylint: disable=invalid-name


class PrivateWeights(NamedTuple):
    """Private (per-client) components of a GUM, padded to the config's table sizes."""

    theta: Any  # [max_users, K]
    difficulty: Any  # [max_items, K]
    discrimination: Any  # [max_items]
    slip: Any  # [max_items]
    guess: Any  # [max_items]


class GumWeights(NamedTuple):
    """All weights of a GUM."""

    public: PublicWeights
    private: PrivateWeights


def initial_public(config: GumConfig, seed: int = 0) -> PublicWeights:
    """Glorot-uniform ``skill_W``/``know_W`` and identity ``relative_M`` (float32 numpy), deterministic in `seed`."""
    rng = np.random.default_rng([seed, 1])
    k, h = config.num_attributes, config.hidden_dim
    limit = np.sqrt(6.0 / (k + h))
    return PublicWeights(
        skill_W=rng.uniform(-limit, limit, (k, h)).astype(np.float32),
        know_W=rng.uniform(-limit, limit, (k, h)).astype(np.float32),
        relative_M=np.eye(k, dtype=np.float32),
    )


def initial_private(config: GumConfig, seed: int = 0) -> PrivateWeights:
    """Normal(0, stddev) theta and b, w = `discrimination_init`, s = g = 0 (float32 numpy, padded tables)."""
    rng = np.random.default_rng([seed, 2])
    k, std = config.num_attributes, config.embedding_init_stddev
    return PrivateWeights(
        theta=rng.normal(0.0, std, (config.max_users, k)).astype(np.float32),
        difficulty=rng.normal(0.0, std, (config.max_items, k)).astype(np.float32),
        discrimination=np.full([config.max_items], config.discrimination_init, np.float32),
        slip=np.zeros([config.max_items], np.float32),
        guess=np.zeros([config.max_items], np.float32),
    )


def initial_weights(config: GumConfig, public_seed: int = 0, private_seed: int = 0) -> GumWeights:
    """`initial_public` and `initial_private` together."""
    return GumWeights(public=initial_public(config, public_seed), private=initial_private(config, private_seed))


def trainable_private_fields(config: GumConfig) -> tuple[str, ...]:
    """Names of the `PrivateWeights` fields trained locally."""
    fields = PrivateWeights._fields
    return fields if config.use_discrimination else tuple(f for f in fields if f != 'discrimination')


def predict(weights: GumWeights, user: tf.Tensor, item: tf.Tensor, attributes: tf.Tensor) -> tf.Tensor:
    """GUM predictions in (0, 1) (see the module docstring for the formula and its range).

    Args:
      weights: The model weights.
      user: int ``[B]`` local user indices.
      item: int ``[B]`` local item indices.
      attributes: float32 ``[B, K]`` multi-hot attribute rows q of the items.

    Returns:
      float32 ``[B]``.
    """
    public, private = weights.public, weights.private
    qm = tf.matmul(attributes, public.relative_M)
    theta = tf.gather(private.theta, user)
    difficulty = tf.gather(private.difficulty, item)
    skill = tf.sigmoid(tf.matmul(theta * qm, public.skill_W))
    knowledge = tf.sigmoid(tf.matmul(difficulty * qm, public.know_W))
    x = tf.reduce_mean(skill - knowledge, axis=-1) * tf.gather(private.discrimination, item)
    slip = tf.sigmoid(tf.gather(private.slip, item) - 1.0)
    guess = tf.sigmoid(tf.gather(private.guess, item) - 1.0)
    return tf.sigmoid((1.0 - slip) * x + guess * (1.0 - x))


def mse_loss(
    weights: GumWeights,
    user: tf.Tensor,
    item: tf.Tensor,
    attributes: tf.Tensor,
    label: tf.Tensor,
    mask: tf.Tensor | None = None,
) -> tf.Tensor:
    """Mean squared error of `predict` against labels in [0, 1] (a scalar; 0 for an empty batch).

    With `mask` (float ``[B]``, 1 for a real example of a padded batch), the mean over the real examples.
    """
    error = predict(weights, user, item, attributes) - label
    if mask is None:
        return tf.math.divide_no_nan(tf.reduce_sum(tf.square(error)), tf.cast(tf.size(error), tf.float32))
    return tf.math.divide_no_nan(tf.reduce_sum(mask * tf.square(error)), tf.reduce_sum(mask))


def to_unit(label, rating_range: Sequence[float]):
    """Maps labels in ``[lo, hi]`` to [0, 1]: ``(r - lo) / (hi - lo)`` (numpy or TF)."""
    lo, hi = rating_range
    return (label - lo) / (hi - lo)


def from_unit(prediction, rating_range: Sequence[float]):
    """Inverse of `to_unit`: ``lo + y (hi - lo)`` (numpy or TF)."""
    lo, hi = rating_range
    return lo + prediction * (hi - lo)


def correct(prediction: tf.Tensor, label: tf.Tensor, config: GumConfig) -> tf.Tensor:
    """float32 1/0 per example: is the prediction right?

    Binary task: ``(y >= 0.5) == (label >= 0.5)``. Rating task: the back-mapped prediction, rounded and clipped to
    the rating range, equals the (rounded) true rating. Both arguments are on the [0, 1] scale.
    """
    if config.task == 'binary':
        return tf.cast(tf.equal(prediction >= 0.5, label >= 0.5), tf.float32)
    lo, hi = config.rating_range
    predicted = tf.clip_by_value(tf.round(from_unit(prediction, config.rating_range)), lo, hi)
    return tf.cast(tf.equal(predicted, tf.round(from_unit(label, config.rating_range))), tf.float32)


def attribute_vector_size(config: GumConfig) -> int:
    """Length ``2 h + K`` of a per-attribute knowledge vector."""
    return 2 * config.hidden_dim + config.num_attributes


def attribute_vectors(public: PublicWeights):
    """The K per-attribute knowledge vectors ``c_k = [skill_W[k], know_W[k], relative_M[k]]`` as ``[K, 2h + K]``."""
    return tf.concat([public.skill_W, public.know_W, public.relative_M], axis=1)


def from_attribute_vectors(vectors, hidden_dim: int) -> PublicWeights:
    """Inverse of `attribute_vectors`."""
    return PublicWeights(
        skill_W=vectors[:, :hidden_dim],
        know_W=vectors[:, hidden_dim : 2 * hidden_dim],
        relative_M=vectors[:, 2 * hidden_dim :],
    )


def user_proficiency(private: PrivateWeights):
    """A user's proficiency on each attribute (for DOA): the user embedding theta ``[max_users, K]``."""
    return private.theta
