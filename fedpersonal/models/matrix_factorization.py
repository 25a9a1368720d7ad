"""Matrix factorization models for rating prediction (FedRecon paper, Section 5.1.1).

The predicted rating for user u and item i is `<P_u, Q_i>` (+ `b_u + b_i + mu`
when `add_biases`). Two layouts:

* *personal* (`personal_model_fn`): the model holds one user's embedding `P_u`
  (and bias) as **local** variables and the item matrix `Q` (and item/global
  biases) as **global** variables. Inputs: `x` = item ids `[B, 1]` int64,
  `y` = ratings `[B, 1]` float32. Used by FedRecon and ReconEval.
* *table* (`table_keras_model`): the model holds the whole user matrix `P`
  (all users) and is fully global. Inputs: `x` = `{"user_id", "item_id"}`.
  Used by centralized training and by FedAvg with user embeddings stored on
  the server (the paper's Table 1 StandardEval rows).

Both share layer names, so item weights move between them with
`item_weights_from_table_model`.

Seeding: every builder takes a keyword-only `seed` (default 0). Each random
initializer gets its own op-level seed `partially_local_model.initializer_seed(seed, k)`
with a fixed index per variable (0: item embeddings, 1: user embedding / user
table, 2: the personal model's user bias; the other variables start at zero), so
the personal and the table model built with the same seed start from the same
item embeddings. Keras draws seeded initial values with stateless random ops:
a model built twice with the same seed has bit-identical weights. In particular
FedRecon, whose clients build the model (`model_fn()` inside `tf.init_scope`)
and start reconstruction from the local variables' initial values, starts
every client in every round from the same user embedding (a function of the
seed only), and two runs with the same seed start identically.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from fedpersonal.models import partially_local_model


class UserEmbedding(tf.keras.layers.Layer):
    """One user's embedding row, broadcast to the batch of its input: `[B, dim]`.

    Initialized uniformly in [-0.05, 0.05] with the op-level `seed` (deterministic: the same value every time a
    layer with that seed is built; give each such layer of a model its own seed).
    """

    def __init__(self, dim: int, l2_regularization: float = 0.0, *, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.dim = dim
        self.l2_regularization = l2_regularization
        self.seed = seed

    def build(self, input_shape):
        self.embedding = self.add_weight(
            name='embedding',
            shape=(1, self.dim),
            initializer=_uniform_init(self.seed),
            regularizer=tf.keras.regularizers.l2(self.l2_regularization) if self.l2_regularization else None,
        )
        super().build(input_shape)

    def call(self, inputs):
        batch_size = tf.shape(inputs)[0]
        return tf.broadcast_to(self.embedding, [batch_size, self.dim])


class GlobalBias(tf.keras.layers.Layer):
    """Adds a learned scalar."""

    def build(self, input_shape):
        self.bias = self.add_weight(name='bias', shape=(), initializer='zeros')
        super().build(input_shape)

    def call(self, inputs):
        return inputs + self.bias


def _uniform_init(seed: int) -> tf.keras.initializers.Initializer:
    # Keras' default 'uniform' embedding init, as in the paper's code; a fresh, seeded instance per variable.
    return tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)


# Initializer indices (`partially_local_model.initializer_seed(seed, index)`), shared by both layouts.
_ITEM_EMBEDDING_SEED, _USER_EMBEDDING_SEED, _USER_BIAS_SEED = 0, 1, 2


def _seed(seed: int, index: int) -> int:
    return partially_local_model.initializer_seed(seed, index)


def _regularizer(l2: float):
    return tf.keras.regularizers.l2(l2) if l2 else None


def personal_input_spec() -> collections.OrderedDict:
    return collections.OrderedDict(
        x=tf.TensorSpec(shape=[None, 1], dtype=tf.int64), y=tf.TensorSpec(shape=[None, 1], dtype=tf.float32)
    )


def table_input_spec() -> collections.OrderedDict:
    return collections.OrderedDict(
        x=collections.OrderedDict(
            user_id=tf.TensorSpec(shape=[None, 1], dtype=tf.int64),
            item_id=tf.TensorSpec(shape=[None, 1], dtype=tf.int64),
        ),
        y=tf.TensorSpec(shape=[None, 1], dtype=tf.float32),
    )


def personal_keras_model(
    num_items: int,
    num_latent_factors: int,
    *,
    add_biases: bool = False,
    l2_regularization: float = 0.0,
    seed: int = 0,
) -> tuple[tf.keras.Model, list[tf.keras.layers.Layer], list[tf.keras.layers.Layer]]:
    """Builds the one-user MF Keras model.

    `seed` (default 0) determines every initial weight (see the module docstring): the same seed gives
    bit-identical initial weights, including the local user embedding.

    Returns:
      `(keras_model, global_layers, local_layers)`.
    """
    item_input = tf.keras.Input(shape=[1], dtype=tf.int64, name='item_id')
    item_embedding = tf.keras.layers.Embedding(
        num_items,
        num_latent_factors,
        embeddings_initializer=_uniform_init(_seed(seed, _ITEM_EMBEDDING_SEED)),
        embeddings_regularizer=_regularizer(l2_regularization),
        name='ItemEmbedding',
    )
    user_embedding = UserEmbedding(
        num_latent_factors, l2_regularization, seed=_seed(seed, _USER_EMBEDDING_SEED), name='UserEmbedding'
    )
    item_vec = tf.keras.layers.Flatten()(item_embedding(item_input))
    user_vec = user_embedding(item_input)
    pred = tf.keras.layers.Dot(axes=1, name='Dot')([item_vec, user_vec])
    global_layers, local_layers = [item_embedding], [user_embedding]
    if add_biases:
        item_bias = tf.keras.layers.Embedding(num_items, 1, embeddings_initializer='zeros', name='ItemBias')
        user_bias = UserEmbedding(1, l2_regularization, seed=_seed(seed, _USER_BIAS_SEED), name='UserBias')
        global_bias = GlobalBias(name='GlobalBias')
        pred = global_bias(
            tf.keras.layers.Add()([pred, tf.keras.layers.Flatten()(item_bias(item_input)), user_bias(item_input)])
        )
        global_layers += [item_bias, global_bias]
        local_layers += [user_bias]
    return tf.keras.Model(inputs=item_input, outputs=pred, name='personal_mf'), global_layers, local_layers


def personal_model_fn(
    num_items: int,
    num_latent_factors: int = 50,
    *,
    add_biases: bool = False,
    l2_regularization: float = 0.0,
    seed: int = 0,
) -> Callable[[], partially_local_model.PartiallyLocalModel]:
    """A no-arg `model_fn` for the personal MF model (user part local, items global).

    Every call builds the model with the same `seed` (default 0), so every call returns bit-identical initial
    weights: FedRecon's per-round local initialization (the clients' user embeddings before reconstruction) is
    the same value for every client in every round, and a function of `seed` only.
    """

    def model_fn() -> partially_local_model.PartiallyLocalModel:
        keras_model, global_layers, local_layers = personal_keras_model(
            num_items, num_latent_factors, add_biases=add_biases, l2_regularization=l2_regularization, seed=seed
        )
        return partially_local_model.from_keras_model(
            keras_model, input_spec=personal_input_spec(), global_layers=global_layers, local_layers=local_layers
        )

    return model_fn


def table_keras_model(
    num_users: int,
    num_items: int,
    num_latent_factors: int,
    *,
    add_biases: bool = False,
    l2_regularization: float = 0.0,
    seed: int = 0,
) -> tf.keras.Model:
    """Builds the MF Keras model with a full user table (fully global).

    `seed` (default 0) determines every initial weight; the item embeddings start as those of
    `personal_keras_model` with the same seed.
    """
    user_input = tf.keras.Input(shape=[1], dtype=tf.int64, name='user_id')
    item_input = tf.keras.Input(shape=[1], dtype=tf.int64, name='item_id')
    item_embedding = tf.keras.layers.Embedding(
        num_items,
        num_latent_factors,
        embeddings_initializer=_uniform_init(_seed(seed, _ITEM_EMBEDDING_SEED)),
        embeddings_regularizer=_regularizer(l2_regularization),
        name='ItemEmbedding',
    )
    user_embedding = tf.keras.layers.Embedding(
        num_users,
        num_latent_factors,
        embeddings_initializer=_uniform_init(_seed(seed, _USER_EMBEDDING_SEED)),
        embeddings_regularizer=_regularizer(l2_regularization),
        name='UserTable',
    )
    item_vec = tf.keras.layers.Flatten()(item_embedding(item_input))
    user_vec = tf.keras.layers.Flatten()(user_embedding(user_input))
    pred = tf.keras.layers.Dot(axes=1, name='Dot')([item_vec, user_vec])
    if add_biases:
        item_bias = tf.keras.layers.Embedding(num_items, 1, embeddings_initializer='zeros', name='ItemBias')
        user_bias = tf.keras.layers.Embedding(num_users, 1, embeddings_initializer='zeros', name='UserBiasTable')
        pred = GlobalBias(name='GlobalBias')(
            tf.keras.layers.Add()(
                [
                    pred,
                    tf.keras.layers.Flatten()(item_bias(item_input)),
                    tf.keras.layers.Flatten()(user_bias(user_input)),
                ]
            )
        )
    return tf.keras.Model(
        inputs=collections.OrderedDict(user_id=user_input, item_id=item_input), outputs=pred, name='table_mf'
    )


_ITEM_LAYERS = ('ItemEmbedding', 'ItemBias', 'GlobalBias')


def item_weights_from_table_model(table_model: tf.keras.Model) -> list[np.ndarray]:
    """Global (item-side) weights of a table model, ordered as the personal model's globals."""
    weights: list[np.ndarray] = []
    for name in _ITEM_LAYERS:
        try:
            layer = table_model.get_layer(name)
        except ValueError:
            continue
        weights.extend(w.numpy() for w in layer.weights)
    return weights


def personal_example(element: collections.OrderedDict) -> collections.OrderedDict:
    """Maps a rating element (see `fedpersonal.data.movielens`) to personal model input."""
    return collections.OrderedDict(
        x=tf.reshape(element['item_id'], [1]), y=tf.reshape(tf.cast(element['rating'], tf.float32), [1])
    )


def table_example(element: collections.OrderedDict) -> collections.OrderedDict:
    """Maps a rating element to table model input."""
    return collections.OrderedDict(
        x=collections.OrderedDict(
            user_id=tf.reshape(element['user_id'], [1]), item_id=tf.reshape(element['item_id'], [1])
        ),
        y=tf.reshape(tf.cast(element['rating'], tf.float32), [1]),
    )
