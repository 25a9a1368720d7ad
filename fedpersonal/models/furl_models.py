"""The FURL personalized document model (Bui et al. 2019, Fig. 1 and Section 4.1).

Character embedding + bidirectional LSTM encode the text into an input representation; a user embedding is
concatenated to it (together with the side features and, for ASSISTments, an item embedding); an MLP maps the
concatenation to class logits. Three personalization modes give the paper's configurations (Table 2):

* ``'none'`` -- *Global* (Server or FL): no user embedding; every variable is global.
* ``'private'`` -- *Personalized FL* (FURL): one private user vector (`UserEmbedding`, the client's own row,
  broadcast to the batch, initialized uniformly in [-0.05, 0.05]) is the model's only **local** variable; everything
  else is global (federated).
* ``'table'`` -- *Personalized Server*: a ``tf.keras.layers.Embedding(num_users, dim)`` looked up by ``user_id``;
  every variable is global (for centralized training, where the server holds all users' embeddings).

Inputs (see `fedpersonal.data.furl_tasks`): batches ``OrderedDict(x=OrderedDict(user_id [B] int64, chars [B,
max_chars] int32, features [B, num_features] float32[, item_id [B] int64]), y=label [B] int64)``, made from dataset
examples by `to_model_input` / `batch_dataset`. Every mode takes the same inputs (``'none'`` and ``'private'``
ignore the value of ``user_id``), so one dataset pipeline serves all configurations.

Outputs: logits ``[B, num_classes]``, also for binary tasks (``num_classes = 2``: softmax over two logits). Use
`loss_fn` (sparse categorical cross-entropy from logits) and `metrics_fn` (accuracy, plus `BinaryAUC` on the
positive-class probability for binary tasks).

Seeding: `build_keras_model` and `furl_model_fn` take a keyword-only ``seed`` (default 0). Every random initializer
gets its own op-level seed ``partially_local_model.initializer_seed(seed, k)`` with a fixed index per variable
(`_INIT_SEEDS`; the same in every personalization mode, so the configurations of one run start from the same
shared weights), including the backward LSTM of the text encoder (which would otherwise copy the forward LSTM's
initializers and start identical to it). Keras draws seeded values with stateless ops: each model built with one
seed has bit-identical initial weights (also the private user embedding, the initial private state of every
client), wherever it is built (eagerly or in a TFF computation's graph).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from fedpersonal import errors
from fedpersonal.models import matrix_factorization
from fedpersonal.models import partially_local_model

__all__ = [
    'PERSONALIZATION_MODES',
    'BinaryAUC',
    'TrimPadding',
    'input_spec',
    'to_model_input',
    'batch_dataset',
    'build_keras_model',
    'furl_model_fn',
    'loss_fn',
    'metrics_fn',
]

PERSONALIZATION_MODES = ('none', 'private', 'table')
# Index of each random initializer in `partially_local_model.initializer_seed(seed, index)`; mlp_k uses 10 + k.
_INIT_SEEDS = dict(
    char_embedding=0,
    forward_kernel=1,
    forward_recurrent=2,
    backward_kernel=3,
    backward_recurrent=4,
    item_embedding=5,
    user_embedding=6,
    logits=9,
    mlp=10,
)
USER_EMBEDDING_LAYER = 'user_embedding'
"""Name of the user-embedding layer (private vector or table) in every personalized model."""


# ----------------------------------------------------------------------------------------------------------------
# Inputs.
# ----------------------------------------------------------------------------------------------------------------


def input_spec(*, max_chars: int, num_features: int, num_items: int = 0) -> collections.OrderedDict:
    """The model's ``OrderedDict(x=..., y=...)`` input spec (batched, leading dimension None)."""
    x = collections.OrderedDict(
        user_id=tf.TensorSpec([None], tf.int64),
        chars=tf.TensorSpec([None, max_chars], tf.int32),
        features=tf.TensorSpec([None, num_features], tf.float32),
    )
    if num_items > 0:
        x['item_id'] = tf.TensorSpec([None], tf.int64)
    return collections.OrderedDict(x=x, y=tf.TensorSpec([None], tf.int64))


def to_model_input(example: Mapping[str, Any]) -> collections.OrderedDict:
    """Maps a dataset example (batched or not) to ``OrderedDict(x=OrderedDict(user_id, chars, features[, item_id]),
    y=label)``; ``item_id`` is kept when the example has it."""
    x = collections.OrderedDict(user_id=example['user_id'], chars=example['chars'], features=example['features'])
    if 'item_id' in example:
        x['item_id'] = example['item_id']
    return collections.OrderedDict(x=x, y=example['label'])


def batch_dataset(
    dataset: tf.data.Dataset,
    *,
    batch_size: int = 16,
    num_epochs: int = 1,
    shuffle_buffer_size: int = 0,
    seed: int = 0,
    max_examples: int | None = None,
) -> tf.data.Dataset:
    """Turns a client's unbatched examples into model batches (matching `input_spec`).

    Order: ``take(max_examples)`` -> ``shuffle`` (if ``shuffle_buffer_size > 1``; op-level ``seed``, default 0, so
    the order is reproducible) -> ``repeat(num_epochs)`` -> ``map(to_model_input)`` -> ``batch(batch_size)``. Usable
    with ``ClientData.preprocess(lambda ds: batch_dataset(ds, ...))`` and inside TFF computations.
    """
    if batch_size < 1 or num_epochs < 1:
        raise errors.ConfigError(f'batch_size and num_epochs must be >= 1, got {batch_size}, {num_epochs}')
    if max_examples is not None:
        dataset = dataset.take(max_examples)
    if shuffle_buffer_size > 1:
        dataset = dataset.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
    if num_epochs > 1:
        dataset = dataset.repeat(num_epochs)
    return dataset.map(to_model_input).batch(batch_size)


# ----------------------------------------------------------------------------------------------------------------
# Model.
# ----------------------------------------------------------------------------------------------------------------


class TrimPadding(tf.keras.layers.Layer):
    """Drops the trailing all-padding columns of a batch of char ids: ``[B, T] -> [B, n]``.

    ``n`` is the largest (last non-padding position + 1) in the batch (at least 1). The masked LSTM ignores padding,
    so its output is unchanged; it just runs ``n`` instead of ``T`` steps (texts are mostly much shorter than
    ``max_chars``).
    """

    def call(self, chars):
        length = tf.shape(chars)[1]
        positions = tf.range(1, length + 1)[tf.newaxis, :] * tf.cast(chars != 0, tf.int32)
        return chars[:, : tf.maximum(tf.reduce_max(positions), 1)]

    def compute_output_shape(self, input_shape):
        return tf.TensorShape([input_shape[0], None])


def build_keras_model(
    *,
    char_vocab_size: int,
    max_chars: int,
    num_features: int,
    num_classes: int,
    personalization: str,
    num_users: int = 0,
    num_items: int = 0,
    char_embedding_dim: int = 16,
    lstm_units: int = 32,
    user_embedding_dim: int = 32,
    item_embedding_dim: int = 16,
    mlp_units: Sequence[int] = (64,),
    seed: int = 0,
) -> tuple[tf.keras.Model, list[tf.keras.layers.Layer], list[tf.keras.layers.Layer]]:
    """Builds the (functional, built, uncompiled) Keras document model.

    ``seed`` (default 0) determines every initial weight: the same seed gives bit-identical weights (see the module
    docstring).

    Returns:
        ``(keras_model, global_layers, local_layers)``: ``local_layers`` is ``[user embedding]`` in ``'private'``
        mode and empty otherwise; ``global_layers`` are all other layers with variables.
    """
    if personalization not in PERSONALIZATION_MODES:
        raise errors.ConfigError(f'personalization must be one of {PERSONALIZATION_MODES}, got {personalization!r}')
    if num_classes < 2:
        raise errors.ConfigError(f'num_classes must be >= 2 (binary tasks use 2 logits), got {num_classes}')
    if max_chars < 0 or num_features < 0 or num_items < 0:
        raise errors.ConfigError(
            f'max_chars, num_features and num_items must be >= 0, got {max_chars}, {num_features}, {num_items}'
        )
    if max_chars > 0 and char_vocab_size < 2:
        raise errors.ConfigError(f'char_vocab_size must be >= 2 when there is text, got {char_vocab_size}')
    if personalization == 'table' and num_users < 1:
        raise errors.ConfigError("personalization='table' needs num_users >= 1 (the size of the user table)")

    init_seed = lambda name, offset=0: partially_local_model.initializer_seed(seed, _INIT_SEEDS[name] + offset)
    uniform = lambda name: tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=init_seed(name))
    glorot = lambda name, offset=0: tf.keras.initializers.GlorotUniform(seed=init_seed(name, offset))
    orthogonal = lambda name: tf.keras.initializers.Orthogonal(seed=init_seed(name))
    inputs = collections.OrderedDict(
        user_id=tf.keras.Input(shape=(), dtype=tf.int64, name='user_id'),
        chars=tf.keras.Input(shape=(max_chars,), dtype=tf.int32, name='chars'),
        features=tf.keras.Input(shape=(num_features,), dtype=tf.float32, name='features'),
    )
    if num_items > 0:
        inputs['item_id'] = tf.keras.Input(shape=(), dtype=tf.int64, name='item_id')

    parts = []
    if max_chars > 0:
        char_embedding = tf.keras.layers.Embedding(
            char_vocab_size,
            char_embedding_dim,
            mask_zero=True,
            embeddings_initializer=uniform('char_embedding'),
            name='char_embedding',
        )
        # RNN(LSTMCell) is the same LSTM as tf.keras.layers.LSTM but skips its cuDNN/CPU backend selection, which
        # makes building the model ~10x and tracing it ~2x faster on CPU (model_fn runs in every TFF trace).
        # The backward LSTM is built here (not copied from the forward one by Bidirectional) to get its own seeds.
        lstm, backward_lstm = (
            tf.keras.layers.RNN(
                tf.keras.layers.LSTMCell(
                    lstm_units,
                    kernel_initializer=glorot(f'{direction}_kernel'),
                    recurrent_initializer=orthogonal(f'{direction}_recurrent'),
                    name='cell',
                ),
                go_backwards=direction == 'backward',
                name='lstm',
            )
            for direction in ('forward', 'backward')
        )
        encoder = tf.keras.layers.Bidirectional(lstm, backward_layer=backward_lstm, name='text_encoder')
        parts.append(encoder(char_embedding(TrimPadding(name='trim_padding')(inputs['chars']))))
    if num_features > 0:
        parts.append(inputs['features'])
    if num_items > 0:
        item_embedding = tf.keras.layers.Embedding(
            num_items, item_embedding_dim, embeddings_initializer=uniform('item_embedding'), name='item_embedding'
        )
        parts.append(item_embedding(inputs['item_id']))

    local_layers: list[tf.keras.layers.Layer] = []
    if personalization == 'private':
        user_layer = matrix_factorization.UserEmbedding(
            user_embedding_dim, seed=init_seed('user_embedding'), name=USER_EMBEDDING_LAYER
        )
        parts.append(user_layer(inputs['user_id']))
        local_layers.append(user_layer)
    elif personalization == 'table':
        user_layer = tf.keras.layers.Embedding(
            num_users, user_embedding_dim, embeddings_initializer=uniform('user_embedding'), name=USER_EMBEDDING_LAYER
        )
        parts.append(user_layer(inputs['user_id']))
    if not parts:
        raise ValueError(
            'the model has no input representation: no text (max_chars=0), no features, no items and '
            "no user embedding (personalization='none')"
        )

    hidden = tf.keras.layers.Concatenate(name='concat')(parts) if len(parts) > 1 else parts[0]
    for k, units in enumerate(mlp_units):
        hidden = tf.keras.layers.Dense(units, activation='relu', kernel_initializer=glorot('mlp', k), name=f'mlp_{k}')(
            hidden
        )
    logits = tf.keras.layers.Dense(num_classes, kernel_initializer=glorot('logits'), name='logits')(hidden)
    keras_model = tf.keras.Model(inputs=inputs, outputs=logits, name=f'furl_{personalization}')
    local_ids = {id(layer) for layer in local_layers}
    global_layers = [layer for layer in keras_model.layers if layer.weights and id(layer) not in local_ids]
    return keras_model, global_layers, local_layers


def furl_model_fn(
    *,
    char_vocab_size: int,
    max_chars: int,
    num_features: int,
    num_classes: int,
    personalization: str,
    num_users: int = 0,
    num_items: int = 0,
    char_embedding_dim: int = 16,
    lstm_units: int = 32,
    user_embedding_dim: int = 32,
    item_embedding_dim: int = 16,
    mlp_units: Sequence[int] = (64,),
    seed: int = 0,
) -> Callable[[], partially_local_model.PartiallyLocalModel]:
    """A no-arg ``model_fn`` returning a new `PartiallyLocalModel` of the FURL document model.

    Pass ``**furl_data.model_kwargs()`` for the input sizes. ``num_users`` is needed (and used) only by
    ``personalization='table'``. In ``'private'`` mode the user embedding is the only local variable, in the other
    modes there are none. Every call builds the model with the same ``seed`` (default 0), so every call returns
    bit-identical initial weights (the private user embedding's initial value, used by a client without a stored
    state if the algorithm takes it from ``model_fn``, is a function of ``seed`` only). See `build_keras_model` and
    the module docstring.
    """
    kwargs: dict[str, Any] = dict(
        char_vocab_size=char_vocab_size,
        max_chars=max_chars,
        num_features=num_features,
        num_classes=num_classes,
        personalization=personalization,
        num_users=num_users,
        num_items=num_items,
        char_embedding_dim=char_embedding_dim,
        lstm_units=lstm_units,
        user_embedding_dim=user_embedding_dim,
        item_embedding_dim=item_embedding_dim,
        mlp_units=tuple(mlp_units),
        seed=seed,
    )
    # Validate the arguments now, not when an algorithm first calls model_fn inside a TFF computation.
    if personalization not in PERSONALIZATION_MODES:
        raise errors.ConfigError(f'personalization must be one of {PERSONALIZATION_MODES}, got {personalization!r}')
    if personalization == 'table' and num_users < 1:
        raise errors.ConfigError("personalization='table' needs num_users >= 1 (the size of the user table)")
    spec_kwargs = dict(max_chars=max_chars, num_features=num_features, num_items=num_items)

    def model_fn() -> partially_local_model.PartiallyLocalModel:
        keras_model, global_layers, local_layers = build_keras_model(**kwargs)
        return partially_local_model.from_keras_model(
            keras_model, input_spec=input_spec(**spec_kwargs), global_layers=global_layers, local_layers=local_layers
        )

    return model_fn


# ----------------------------------------------------------------------------------------------------------------
# Loss and metrics.
# ----------------------------------------------------------------------------------------------------------------


class BinaryAUC(tf.keras.metrics.AUC):
    """ROC AUC of a two-logit (or two-probability) binary classifier.

    ``update_state(y_true, y_pred)`` takes labels ``[B]`` (or ``[B, 1]``) in {0, 1} and predictions ``[B, 2]``; the
    score of an example is ``softmax(y_pred)[:, 1]`` (``from_logits=True``) or ``y_pred[:, 1]``, accumulated by
    `tf.keras.metrics.AUC` (confusion counts at ``num_thresholds`` thresholds, trapezoidal ROC). The variables are
    those of `tf.keras.metrics.AUC`, so summing them over clients (``tff.learning.metrics.sum_then_finalize``) and
    finalizing gives the AUC of the pooled examples; ``get_config`` holds exactly the constructor arguments, so TFF's
    Keras metric finalizer can rebuild it.
    """

    def __init__(self, num_thresholds: int = 200, name: str = 'auc', dtype=None, from_logits: bool = True):
        super().__init__(
            num_thresholds=num_thresholds, curve='ROC', summation_method='interpolation', name=name, dtype=dtype
        )
        self._binary_from_logits = from_logits

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = tf.convert_to_tensor(y_pred)
        probabilities = tf.nn.softmax(y_pred, axis=-1) if self._binary_from_logits else y_pred
        score = tf.reshape(probabilities[..., 1], [-1])
        y_true = tf.reshape(y_true, [-1])
        if sample_weight is not None:
            sample_weight = tf.reshape(sample_weight, [-1])
        super().update_state(y_true, score, sample_weight=sample_weight)

    def get_config(self):
        return {
            'num_thresholds': self.num_thresholds,
            'name': self.name,
            'dtype': self.dtype,
            'from_logits': self._binary_from_logits,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def loss_fn() -> tf.keras.losses.Loss:
    """Sparse categorical cross-entropy on the logits."""
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def metrics_fn(num_classes: int) -> list[tf.keras.metrics.Metric]:
    """``[accuracy]``, plus ``auc`` (`BinaryAUC`) when ``num_classes == 2``.

    Algorithms take a no-arg function: ``metrics_fn=functools.partial(furl_models.metrics_fn, num_classes=2)``.
    """
    metrics: list[tf.keras.metrics.Metric] = [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]
    if num_classes == 2:
        metrics.append(BinaryAUC(name='auc'))
    return metrics
