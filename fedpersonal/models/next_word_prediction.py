"""Next-word prediction LSTM with local out-of-vocabulary embeddings (FedRecon, Section 5.1.2).

The input embedding is split in two tables over the `TokenLayout` id space:

* `GlobalTokenEmbedding`: rows for pad, the V words, BOS and EOS (global,
  aggregated by the server);
* `LocalOovEmbedding`: one row per OOV hash bucket (local: reconstructed on
  each client, never sent).

Each id is looked up in exactly one table (the other contributes zeros); the
sum feeds an LSTM, a projection back to the embedding size and an output layer
over every id (V + 3 + B classes; the model predicts OOV buckets too, as in the
paper's code). Sizes are arguments; the experiments use a CPU-sized model
(embedding 32, LSTM 64); the paper used embedding 96 and LSTM 670.

`oov_local=False` builds the same network with the OOV table global (the FedYogi
and fine-tuning baselines, which send everything).

Loss and metrics skip pad targets. Accuracy is reported three ways
(`NextWordAccuracy`): over all targets, without OOV targets, and without OOV and
EOS targets.

Seeding: `build_keras_model` and `model_fn` take a keyword-only `seed` (default
0); the k-th random initializer (0: global embedding, 1: OOV table, 2: LSTM
kernel, 3: LSTM recurrent kernel, 4: projection kernel, 5: output kernel; biases
start at zero) gets the op-level seed `partially_local_model.initializer_seed(seed, k)`
(for seed 0 simply k). Keras draws seeded values with stateless ops, so a model
built twice with one seed has bit-identical weights; in particular FedRecon's
clients, which build the model inside their computation and reconstruct the
local OOV table from its initial value, start every round from the same OOV
table (a function of the seed only).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import tensorflow as tf

from fedpersonal.data import text_pipeline
from fedpersonal.models import partially_local_model

GLOBAL_EMBEDDING = 'global_embedding'
LOCAL_OOV_EMBEDDING = 'oov_embedding'


class GlobalTokenEmbedding(tf.keras.layers.Layer):
    """Embeds ids below `num_rows`; ids at or above it (OOV buckets) give zeros."""

    def __init__(self, num_rows: int, dim: int, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.num_rows, self.dim, self.seed = num_rows, dim, seed

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            name='embeddings',
            shape=(self.num_rows, self.dim),
            initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=self.seed),
        )

    def call(self, ids):
        inside = ids < self.num_rows
        rows = tf.nn.embedding_lookup(self.embeddings, tf.where(inside, ids, tf.zeros_like(ids)))
        return rows * tf.cast(inside, rows.dtype)[..., tf.newaxis]


class LocalOovEmbedding(tf.keras.layers.Layer):
    """Embeds ids `first_id .. first_id + num_buckets - 1` (row id - first_id); other ids give zeros."""

    def __init__(self, num_buckets: int, dim: int, first_id: int, seed: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.num_buckets, self.dim, self.first_id, self.seed = num_buckets, dim, first_id, seed

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            name='embeddings',
            shape=(self.num_buckets, self.dim),
            initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=self.seed),
        )

    def call(self, ids):
        inside = ids >= self.first_id
        rows = tf.nn.embedding_lookup(self.embeddings, tf.where(inside, ids - self.first_id, tf.zeros_like(ids)))
        return rows * tf.cast(inside, rows.dtype)[..., tf.newaxis]


def input_spec(max_sequence_length: int = 20) -> collections.OrderedDict:
    """Batched `{'x', 'y'}` int64 `[batch, L]`."""
    spec = tf.TensorSpec([None, max_sequence_length], tf.int64)
    return collections.OrderedDict(x=spec, y=spec)


def build_keras_model(
    layout: text_pipeline.TokenLayout,
    *,
    max_sequence_length: int = 20,
    embedding_dim: int = 64,
    lstm_units: int = 128,
    seed: int = 0,
) -> tuple[tf.keras.Model, list[tf.keras.layers.Layer], list[tf.keras.layers.Layer]]:
    """The Keras LSTM and its (global layers, local layers) split (local = the OOV table).

    `seed` (default 0) determines every initial weight (see the module docstring).
    """
    init_seed = lambda index: partially_local_model.initializer_seed(seed, index)
    ids = tf.keras.Input(shape=(max_sequence_length,), dtype=tf.int64, name='x')
    global_embedding = GlobalTokenEmbedding(
        layout.num_global_ids, embedding_dim, seed=init_seed(0), name=GLOBAL_EMBEDDING
    )
    oov_embedding = LocalOovEmbedding(
        layout.num_oov_buckets, embedding_dim, layout.oov_start, seed=init_seed(1), name=LOCAL_OOV_EMBEDDING
    )
    embedded = tf.keras.layers.Add()([global_embedding(ids), oov_embedding(ids)])
    lstm = tf.keras.layers.LSTM(
        lstm_units,
        return_sequences=True,
        name='lstm',
        kernel_initializer=tf.keras.initializers.GlorotUniform(seed=init_seed(2)),
        recurrent_initializer=tf.keras.initializers.Orthogonal(seed=init_seed(3)),
    )
    projection = tf.keras.layers.Dense(
        embedding_dim, name='projection', kernel_initializer=tf.keras.initializers.GlorotUniform(seed=init_seed(4))
    )
    output = tf.keras.layers.Dense(
        layout.num_classes, name='logits', kernel_initializer=tf.keras.initializers.GlorotUniform(seed=init_seed(5))
    )
    logits = output(projection(lstm(embedded)))
    model = tf.keras.Model(ids, logits, name='next_word_lstm')
    return model, [global_embedding, lstm, projection, output], [oov_embedding]


def model_fn(
    layout: text_pipeline.TokenLayout,
    *,
    oov_local: bool = True,
    max_sequence_length: int = 20,
    embedding_dim: int = 64,
    lstm_units: int = 128,
    seed: int = 0,
) -> Callable[[], partially_local_model.PartiallyLocalModel]:
    """A no-arg `model_fn` for `build_fed_recon` / evaluations (OOV table local unless `oov_local=False`).

    Every call builds the model with the same `seed` (default 0): bit-identical initial weights, so the OOV table
    FedRecon reconstructs from is the same for every client in every round.
    """

    def build() -> partially_local_model.PartiallyLocalModel:
        keras_model, global_layers, local_layers = build_keras_model(
            layout,
            max_sequence_length=max_sequence_length,
            embedding_dim=embedding_dim,
            lstm_units=lstm_units,
            seed=seed,
        )
        if not oov_local:
            global_layers, local_layers = global_layers + local_layers, []
        return partially_local_model.from_keras_model(
            keras_model,
            input_spec=input_spec(max_sequence_length),
            global_layers=global_layers,
            local_layers=local_layers,
        )

    return build


@tf.custom_gradient
def _token_cross_entropy(logits: tf.Tensor, labels: tf.Tensor):
    probabilities = tf.nn.softmax(logits)
    # log(sum_j exp(l_j - max l)) = -log(max_j p_j): the largest probability is >= 1 / classes, never underflows.
    log_normalizer = tf.reduce_max(logits, axis=-1) - tf.math.log(tf.reduce_max(probabilities, axis=-1))
    picked = tf.gather(logits, labels, batch_dims=logits.shape.rank - 1)

    def gradient(upstream):
        depth = tf.shape(logits)[-1]
        return upstream[..., tf.newaxis] * (probabilities - tf.one_hot(labels, depth, dtype=logits.dtype)), None

    return log_normalizer - picked, gradient


def token_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-token softmax cross-entropy from logits: ``sparse_categorical_crossentropy(from_logits=True)``.

    The same values and gradients (to float rounding) at a third of the cost on this CPU build: oneDNN's softmax
    instead of TF's fused `SparseSoftmaxCrossEntropyWithLogits` kernel, which took 45% of the engine's next-word
    client steps (3,200 tokens x 1,503 classes, forward and gradient: 49 vs 16 ms on one core). Vectorizes over clients
    (`tf.vectorized_map`).

    >>> logits = tf.constant([[2.0, 0.5, -1.0], [0.0, 0.0, 0.0]])
    >>> labels = tf.constant([0, 2])
    >>> keras = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    >>> bool(tf.reduce_max(tf.abs(token_cross_entropy(labels, logits) - keras)) < 1e-6)
    True
    """
    return _token_cross_entropy(logits, tf.cast(labels, tf.int32))


class MaskedSparseCrossEntropy(tf.keras.losses.Loss):
    """Mean token cross-entropy over non-pad targets (from logits; `token_cross_entropy`)."""

    def __init__(self, pad_id: int = 0, name: str = 'masked_sparse_cross_entropy'):
        super().__init__(name=name)
        self.pad_id = pad_id

    def __call__(self, y_true, y_pred, sample_weight=None):
        y_true = tf.cast(y_true, tf.int64)
        per_token = token_cross_entropy(y_true, y_pred)
        mask = tf.cast(tf.not_equal(y_true, self.pad_id), per_token.dtype)
        return tf.math.divide_no_nan(tf.reduce_sum(per_token * mask), tf.reduce_sum(mask))

    def get_config(self):
        return {'pad_id': self.pad_id, 'name': self.name}


class NextWordAccuracy(tf.keras.metrics.Metric):
    """Top-1 accuracy over target tokens, skipping pad (and optionally OOV and EOS targets).

    Args:
      vocab_size: V of the `TokenLayout`.
      num_oov_buckets: B of the `TokenLayout`.
      exclude_oov: Skip targets that are OOV buckets.
      exclude_eos: Skip EOS targets.
    """

    def __init__(
        self,
        vocab_size: int,
        num_oov_buckets: int,
        exclude_oov: bool = False,
        exclude_eos: bool = False,
        name: str = 'accuracy',
        dtype=tf.float32,
    ):
        super().__init__(name=name, dtype=dtype)
        self.layout = text_pipeline.TokenLayout(vocab_size, num_oov_buckets)
        self.exclude_oov, self.exclude_eos = exclude_oov, exclude_eos
        self.correct = self.add_weight('correct', initializer='zeros', dtype=tf.float32)
        self.total = self.add_weight('total', initializer='zeros', dtype=tf.float32)

    def update_state(self, y_true, y_pred, sample_weight=None):
        del sample_weight
        y_true = tf.cast(y_true, tf.int64)
        keep = tf.not_equal(y_true, self.layout.pad)
        if self.exclude_oov:
            keep &= y_true < self.layout.oov_start
        if self.exclude_eos:
            keep &= tf.not_equal(y_true, self.layout.eos)
        hit = tf.equal(tf.argmax(y_pred, axis=-1, output_type=tf.int64), y_true)
        keep = tf.cast(keep, tf.float32)
        self.correct.assign_add(tf.reduce_sum(tf.cast(hit, tf.float32) * keep))
        self.total.assign_add(tf.reduce_sum(keep))

    def result(self):
        return tf.math.divide_no_nan(self.correct, self.total)

    def reset_state(self):
        self.correct.assign(0.0)
        self.total.assign(0.0)

    def get_config(self):
        return {
            'vocab_size': self.layout.vocab_size,
            'num_oov_buckets': self.layout.num_oov_buckets,
            'exclude_oov': self.exclude_oov,
            'exclude_eos': self.exclude_eos,
            'name': self.name,
            'dtype': self.dtype,
        }


METRIC_NAMES = ('accuracy', 'accuracy_no_oov', 'accuracy_no_oov_no_eos')


def metrics_fn(layout: text_pipeline.TokenLayout) -> Callable[[], list[tf.keras.metrics.Metric]]:
    """The three accuracies (`METRIC_NAMES`)."""

    v, b = layout.vocab_size, layout.num_oov_buckets

    def build() -> list[tf.keras.metrics.Metric]:
        return [
            NextWordAccuracy(v, b, name='accuracy'),
            NextWordAccuracy(v, b, exclude_oov=True, name='accuracy_no_oov'),
            NextWordAccuracy(v, b, exclude_oov=True, exclude_eos=True, name='accuracy_no_oov_no_eos'),
        ]

    return build


def loss_fn() -> tf.keras.losses.Loss:
    return MaskedSparseCrossEntropy()
