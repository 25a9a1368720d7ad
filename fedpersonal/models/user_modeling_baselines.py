"""Centralized user-modeling baselines of HPFL (Wu et al., WWW 2021): NCD, NCF and the pooled GUM, in plain TF.

Every model holds `tf.Variable` tables indexed by *global* user and item indices (the pooled data of all silos) and
exposes the same small interface (`CentralizedModel`):

* ``predict(user, item, attributes) -> [B]`` in (0, 1): the probability of a correct answer (binary task) or the
  rating mapped to the unit interval (`fedpersonal.models.gum.to_unit`);
* ``loss(user, item, attributes, label)``: the training loss on unit-scale labels;
* ``constrain()``: a projection applied after every optimizer step (NCD's non-negative weights);
* ``user_attribute_scores(item_attributes)``: ``[num_users, K]`` per-attribute user scores for DOA.

Models:

* `NcdModel`, Neural Cognitive Diagnosis (Wang et al., AAAI 2020; EduCDM's ``NCDM``): proficiency
  ``h_s = sigmoid(theta_s)`` ``[K]``, knowledge difficulty ``h_diff = sigmoid(B_e)`` ``[K]``, discrimination
  ``h_disc = sigmoid(D_e)`` (scalar), ``x = Q_e * (h_s - h_diff) * h_disc``, then a positive-weight MLP
  (sigmoid hidden layers, sigmoid output). The monotonicity assumption is enforced by clipping every MLP weight
  matrix to ``>= 0`` after each step (EduCDM reparameterizes ``w -> 2 relu(-w) + w`` instead; clipping is the
  NeuralCD paper's projection). Loss: binary cross-entropy. DOA scores: ``h_s``.
* `NcfModel`, Neural Collaborative Filtering (He et al., WWW 2017; NeuMF): a GMF branch (element-wise product of
  user and item embeddings) and an MLP branch (concatenated embeddings through ReLU layers), concatenated and
  mapped by one dense unit and a sigmoid to the unit rating. Loss: mean squared error (rating task) or binary
  cross-entropy (binary task). NCF has no per-attribute user parameter, so its DOA score ``F[u, k]`` is the mean
  predicted score of user u over all items having attribute k (the user's predicted preference for the genre).
* `CentralGumModel`: the General User Model of `fedpersonal.models.gum` (the same prediction and MSE loss as the
  federated methods) with one user table and one item table over the pooled data. DOA scores: theta
  (`gum.user_proficiency`).

`train_centralized` trains any of them with Adam on the pooled train split and keeps the weights of the epoch with
the lowest validation loss (model selection never looks at test data).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from fedpersonal.models import gum

__all__ = [
    'CentralizedModel',
    'NcdModel',
    'NcfModel',
    'CentralGumModel',
    'PooledArrays',
    'TrainingResult',
    'train_centralized',
    'predict_arrays',
]


class CentralizedModel(abc.ABC):
    """Interface of a centralized user model (see the module docstring)."""

    variables: list[tf.Variable]

    @abc.abstractmethod
    def predict(self, user: tf.Tensor, item: tf.Tensor, attributes: tf.Tensor) -> tf.Tensor:
        """Predictions on the label scale."""

    @abc.abstractmethod
    def loss(self, user: tf.Tensor, item: tf.Tensor, attributes: tf.Tensor, label: tf.Tensor) -> tf.Tensor:
        """Training loss of a batch."""

    @tf.autograph.experimental.do_not_convert
    def constrain(self) -> None:
        """Projection after each optimizer step (default: none)."""
        return None

    @abc.abstractmethod
    def user_attribute_scores(self, item_attributes: np.ndarray) -> np.ndarray:
        """Per-user, per-attribute proficiency/preference scores (for DOA)."""


def _bce(prediction: tf.Tensor, label: tf.Tensor) -> tf.Tensor:
    p = tf.clip_by_value(prediction, 1e-6, 1.0 - 1e-6)
    return -tf.reduce_mean(label * tf.math.log(p) + (1.0 - label) * tf.math.log(1.0 - p))


def _glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f'{name} must be a positive int, got {value!r}.')


class NcdModel(CentralizedModel):
    """Neural Cognitive Diagnosis with a positive-weight prediction MLP (see the module docstring).

    Args:
      num_users: Rows of the proficiency table.
      num_items: Rows of the difficulty/discrimination tables.
      num_attributes: K (knowledge concepts).
      hidden_units: Widths of the positive MLP's hidden layers (NeuralCD: 512, 256; smaller is enough here).
      seed: Initialization seed.
    """

    def __init__(
        self,
        num_users: int,
        num_items: int,
        num_attributes: int,
        *,
        hidden_units: Sequence[int] = (64, 32),
        seed: int = 0,
    ):
        _check_positive(num_users=num_users, num_items=num_items, num_attributes=num_attributes)
        if not hidden_units:
            raise ValueError('hidden_units must name at least one hidden layer.')
        _check_positive(**{f'hidden_units[{i}]': int(h) for i, h in enumerate(hidden_units)})
        rng = np.random.default_rng([seed, 11])
        k = num_attributes
        self.theta = tf.Variable(rng.normal(0, 0.1, (num_users, k)).astype(np.float32), name='ncd_theta')
        self.difficulty = tf.Variable(rng.normal(0, 0.1, (num_items, k)).astype(np.float32), name='ncd_difficulty')
        self.discrimination = tf.Variable(
            rng.normal(0, 0.1, (num_items,)).astype(np.float32), name='ncd_discrimination'
        )
        widths = [k, *[int(h) for h in hidden_units], 1]
        # Non-negative initial weights (|glorot|), so the monotonicity holds from the start.
        self.kernels = [
            tf.Variable(np.abs(_glorot(rng, a, b)), name=f'ncd_kernel_{i}')
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))
        ]
        self.biases = [tf.Variable(np.zeros([b], np.float32), name=f'ncd_bias_{i}') for i, b in enumerate(widths[1:])]
        self.variables = [self.theta, self.difficulty, self.discrimination, *self.kernels, *self.biases]

    def predict(self, user, item, attributes):
        proficiency = tf.sigmoid(tf.gather(self.theta, user))
        difficulty = tf.sigmoid(tf.gather(self.difficulty, item))
        discrimination = tf.sigmoid(tf.gather(self.discrimination, item))[:, None]
        x = attributes * (proficiency - difficulty) * discrimination
        for kernel, bias in zip(self.kernels, self.biases):
            x = tf.sigmoid(tf.matmul(x, kernel) + bias)
        return x[:, 0]

    def loss(self, user, item, attributes, label):
        return _bce(self.predict(user, item, attributes), label)

    def constrain(self) -> None:
        for kernel in self.kernels:
            kernel.assign(tf.maximum(kernel, 0.0))

    def user_attribute_scores(self, item_attributes: np.ndarray) -> np.ndarray:
        del item_attributes
        return tf.sigmoid(self.theta).numpy()


class NcfModel(CentralizedModel):
    """Neural collaborative filtering (GMF + MLP, NeuMF) predicting a unit-scale rating or a probability.

    Args:
      num_users: Rows of the user tables.
      num_items: Rows of the item tables.
      embedding_dim: Width of the GMF embeddings and of the MLP embeddings.
      mlp_units: Hidden widths of the MLP branch (ReLU).
      task: 'rating' (MSE loss) or 'binary' (cross-entropy).
      seed: Initialization seed.
    """

    def __init__(
        self,
        num_users: int,
        num_items: int,
        *,
        embedding_dim: int = 16,
        mlp_units: Sequence[int] = (32, 16),
        task: str = 'rating',
        seed: int = 0,
    ):
        _check_positive(num_users=num_users, num_items=num_items, embedding_dim=embedding_dim)
        if task not in gum.TASKS:
            raise ValueError(f'task must be one of {gum.TASKS}, got {task!r}.')
        rng = np.random.default_rng([seed, 12])
        d = embedding_dim
        table = lambda n, name: tf.Variable(rng.normal(0, 0.1, (n, d)).astype(np.float32), name=name)
        self.task = task
        self.gmf_user, self.gmf_item = table(num_users, 'ncf_gmf_user'), table(num_items, 'ncf_gmf_item')
        self.mlp_user, self.mlp_item = table(num_users, 'ncf_mlp_user'), table(num_items, 'ncf_mlp_item')
        widths = [2 * d, *[int(h) for h in mlp_units]]
        self.kernels = [
            tf.Variable(_glorot(rng, a, b), name=f'ncf_kernel_{i}')
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))
        ]
        self.biases = [tf.Variable(np.zeros([b], np.float32), name=f'ncf_bias_{i}') for i, b in enumerate(widths[1:])]
        self.output_kernel = tf.Variable(_glorot(rng, d + widths[-1], 1), name='ncf_output_kernel')
        self.output_bias = tf.Variable(np.zeros([1], np.float32), name='ncf_output_bias')
        self.num_items = num_items
        self.variables = [
            self.gmf_user,
            self.gmf_item,
            self.mlp_user,
            self.mlp_item,
            *self.kernels,
            *self.biases,
            self.output_kernel,
            self.output_bias,
        ]

    def predict(self, user, item, attributes):
        del attributes  # NCF uses ids only.
        gmf = tf.gather(self.gmf_user, user) * tf.gather(self.gmf_item, item)
        x = tf.concat([tf.gather(self.mlp_user, user), tf.gather(self.mlp_item, item)], axis=1)
        for kernel, bias in zip(self.kernels, self.biases):
            x = tf.nn.relu(tf.matmul(x, kernel) + bias)
        return tf.sigmoid(tf.matmul(tf.concat([gmf, x], axis=1), self.output_kernel) + self.output_bias)[:, 0]

    def loss(self, user, item, attributes, label):
        prediction = self.predict(user, item, attributes)
        if self.task == 'binary':
            return _bce(prediction, label)
        return tf.reduce_mean(tf.square(prediction - label))

    def user_attribute_scores(self, item_attributes: np.ndarray) -> np.ndarray:
        """``F[u, k]``: the mean predicted score of user u over the items with attribute k (0 if none)."""
        item_attributes = np.asarray(item_attributes, np.float32)
        num_users = int(self.gmf_user.shape[0])
        items = tf.range(self.num_items, dtype=tf.int64)
        counts = np.maximum(item_attributes.sum(axis=0), 1.0)
        scores = np.zeros([num_users, item_attributes.shape[1]], np.float32)
        for start in range(0, num_users, 64):
            users = np.arange(start, min(start + 64, num_users))
            u = tf.repeat(tf.constant(users, tf.int64), self.num_items)
            i = tf.tile(items, [users.size])
            p = tf.reshape(self.predict(u, i, None), [users.size, self.num_items]).numpy()
            scores[users] = p @ item_attributes / counts
        return scores


class CentralGumModel(CentralizedModel):
    """The GUM (`fedpersonal.models.gum`) on pooled data: one user table and one item table for all silos.

    Args:
      config: A `gum.GumConfig` whose ``max_users``/``max_items`` are the pooled numbers of users and items.
      seed: Initialization seed (public and private parts).
    """

    def __init__(self, config: gum.GumConfig, *, seed: int = 0):
        self.config = config
        weights = gum.initial_weights(config, seed, seed)
        self.public = gum.PublicWeights(
            *[tf.Variable(v, name=f'gum_{n}') for n, v in zip(gum.PublicWeights._fields, weights.public)]
        )
        self.private = gum.PrivateWeights(
            *[tf.Variable(v, name=f'gum_{n}') for n, v in zip(gum.PrivateWeights._fields, weights.private)]
        )
        trainable = gum.trainable_private_fields(config)
        self.variables = [*self.public, *[getattr(self.private, f) for f in trainable]]

    def weights(self) -> gum.GumWeights:
        return gum.GumWeights(public=self.public, private=self.private)

    def predict(self, user, item, attributes):
        return gum.predict(self.weights(), user, item, attributes)

    def loss(self, user, item, attributes, label):
        return gum.mse_loss(self.weights(), user, item, attributes, label)

    def user_attribute_scores(self, item_attributes: np.ndarray) -> np.ndarray:
        del item_attributes
        return gum.user_proficiency(self.private).numpy()


@dataclasses.dataclass(frozen=True)
class PooledArrays:
    """Records of one split of the pooled data (global indices, unit-scale labels).

    Attributes:
      user: int64 ``[n]`` global user index.
      item: int64 ``[n]`` global item index.
      attributes: float32 ``[n, K]`` the item's attribute row.
      label: float32 ``[n]`` label on the unit scale.
    """

    user: np.ndarray
    item: np.ndarray
    attributes: np.ndarray
    label: np.ndarray

    def __post_init__(self):
        n = np.asarray(self.user).shape[0]
        for name in ('item', 'attributes', 'label'):
            if np.asarray(getattr(self, name)).shape[0] != n:
                raise ValueError(f'PooledArrays.{name} has {np.asarray(getattr(self, name)).shape[0]} rows, user {n}.')

    def dataset(self, batch_size: int, shuffle_seed: int | None = None) -> tf.data.Dataset:
        data = tf.data.Dataset.from_tensor_slices(
            (
                self.user.astype(np.int64),
                self.item.astype(np.int64),
                self.attributes.astype(np.float32),
                self.label.astype(np.float32),
            )
        )
        if shuffle_seed is not None:
            data = data.shuffle(self.user.shape[0], seed=shuffle_seed, reshuffle_each_iteration=True)
        return data.batch(batch_size)


@dataclasses.dataclass
class TrainingResult:
    """History of `train_centralized`.

    Attributes:
      history: One dict per epoch: ``epoch``, ``train_loss``, ``validation_loss``, ``seconds``.
      best_epoch: The epoch (1-based) whose weights the model holds at the end.
      best_validation_loss: Its validation loss.
    """

    history: list[dict[str, float]]
    best_epoch: int
    best_validation_loss: float


def predict_arrays(model: CentralizedModel, arrays: PooledArrays, batch_size: int = 1024) -> np.ndarray:
    """Unit-scale predictions of `model` on every record of `arrays` (record order)."""
    out = [model.predict(u, i, a).numpy() for u, i, a, _ in arrays.dataset(batch_size)]
    return np.concatenate(out) if out else np.zeros([0], np.float32)


def _mean_loss(model: CentralizedModel, arrays: PooledArrays, batch_size: int) -> float:
    total, n = 0.0, 0
    for u, i, a, y in arrays.dataset(batch_size):
        size = int(y.shape[0])
        total += float(model.loss(u, i, a, y)) * size
        n += size
    return total / max(n, 1)


def train_centralized(
    model: CentralizedModel,
    train: PooledArrays,
    validation: PooledArrays,
    *,
    epochs: int,
    learning_rate: float = 0.01,
    batch_size: int = 256,
    seed: int = 0,
    on_epoch_end: Callable[[int, dict[str, float]], Any] | None = None,
) -> TrainingResult:
    """Adam on the pooled train split; keeps the weights of the epoch with the lowest validation loss.

    `model.constrain()` runs after every step. The validation loss is the model's own loss on the validation split.

    Args:
      model: A `CentralizedModel`.
      train: Train records.
      validation: Validation records (model selection).
      epochs: Number of epochs (>= 1).
      learning_rate: Adam's learning rate.
      batch_size: Batch size.
      seed: Shuffling seed.
      on_epoch_end: Called with ``(epoch, metrics)`` after each epoch.

    Returns:
      A `TrainingResult`; the model holds the best epoch's weights.
    """
    import time  # pylint: disable=g-import-not-at-top

    _check_positive(epochs=epochs, batch_size=batch_size)
    if not learning_rate > 0:
        raise ValueError(f'learning_rate must be positive, got {learning_rate}.')
    optimizer = tf.keras.optimizers.Adam(learning_rate)

    @tf.function
    def step(user, item, attributes, label):
        with tf.GradientTape() as tape:
            loss = model.loss(user, item, attributes, label)
        gradients = tape.gradient(loss, model.variables)
        optimizer.apply_gradients(zip(gradients, model.variables))
        model.constrain()
        return loss

    history, best, best_values = [], (np.inf, 0), None
    for epoch in range(1, epochs + 1):
        started = time.time()
        total, n = 0.0, 0
        for u, i, a, y in train.dataset(batch_size, shuffle_seed=seed):
            size = int(y.shape[0])
            total += float(step(u, i, a, y)) * size
            n += size
        validation_loss = _mean_loss(model, validation, 4 * batch_size)
        row = {
            'epoch': epoch,
            'train_loss': total / max(n, 1),
            'validation_loss': validation_loss,
            'seconds': time.time() - started,
        }
        history.append(row)
        if on_epoch_end is not None:
            on_epoch_end(epoch, row)
        if validation_loss < best[0]:
            best = (validation_loss, epoch)
            best_values = [v.numpy() for v in model.variables]
    if best_values is not None:
        for variable, value in zip(model.variables, best_values):
            variable.assign(value)
    return TrainingResult(history=history, best_epoch=best[1], best_validation_loss=float(best[0]))
