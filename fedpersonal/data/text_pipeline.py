"""Token ids for next-word prediction with out-of-vocabulary (OOV) buckets.

Id layout (`TokenLayout`), chosen so that exactly the OOV ids are local:

=====================  ===========================  ================
id                     meaning                      embedding table
=====================  ===========================  ================
0                      pad                          global row 0
1 .. V                 the V vocabulary words        global rows
V + 1                  BOS (beginning of sequence)  global row
V + 2                  EOS (end of sequence)        global row
V + 3 .. V + 2 + B     the B OOV hash buckets       local rows 0..B-1
=====================  ===========================  ================

The FedRecon paper's code numbers ids pad, words, OOV buckets, BOS, EOS and
sends ids >= V + 3 to the local table; with that numbering the first two OOV
buckets land in the *global* table and BOS/EOS in the last two *local* rows
(an off-by-one: with B = 1 the only bucket is global and EOS is local). Here
BOS/EOS come before the buckets, so the global table has exactly V + 3 rows
(pad, words, BOS, EOS) and the local table exactly B rows, one per bucket.

Words are mapped with `tf.lookup.StaticVocabularyTable` (vocabulary -> 0..V-1,
anything else -> V + fingerprint64(word) % B), then shifted into the layout.
Each example (a string of space-separated tokens) becomes
`[BOS] + ids[:L] + [EOS if fewer than L tokens]`, padded to L + 1; the model
input is the first L ids and the label the last L (next-word targets).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from fedpersonal import errors


class TextPipelineError(errors.DataError):
    """Bad vocabulary, layout or client text (names the client when there is one)."""


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """Where pad, words, BOS, EOS and OOV buckets live in the id space.

    Attributes:
      vocab_size: V, number of in-vocabulary words.
      num_oov_buckets: B, number of OOV hash buckets (>= 1).
    """

    vocab_size: int
    num_oov_buckets: int

    def __post_init__(self):
        if self.vocab_size < 1:
            raise TextPipelineError(f'vocab_size must be >= 1, got {self.vocab_size}.')
        if self.num_oov_buckets < 1:
            raise TextPipelineError(f'num_oov_buckets must be >= 1, got {self.num_oov_buckets}.')

    pad: int = dataclasses.field(default=0, init=False)

    @property
    def bos(self) -> int:
        return self.vocab_size + 1

    @property
    def eos(self) -> int:
        return self.vocab_size + 2

    @property
    def oov_start(self) -> int:
        """First OOV id; ids >= oov_start are OOV buckets (local embedding rows id - oov_start)."""
        return self.vocab_size + 3

    @property
    def num_global_ids(self) -> int:
        """Rows of the global embedding: pad, V words, BOS, EOS."""
        return self.vocab_size + 3

    @property
    def num_classes(self) -> int:
        """Size of the output layer: every id."""
        return self.vocab_size + 3 + self.num_oov_buckets

    def oov_ids(self) -> range:
        return range(self.oov_start, self.num_classes)


def build_vocab_table(vocab: Sequence[str], num_oov_buckets: int) -> tf.lookup.StaticVocabularyTable:
    """`StaticVocabularyTable`: vocab[i] -> i, any other word -> len(vocab) + hash bucket."""
    vocab = list(vocab)
    if num_oov_buckets < 1:
        raise TextPipelineError(f'num_oov_buckets must be >= 1, got {num_oov_buckets}.')
    if not vocab:
        raise TextPipelineError('The vocabulary is empty.')
    if len(set(vocab)) != len(vocab):
        duplicates = sorted({w for w in vocab if vocab.count(w) > 1})[:5]
        raise TextPipelineError(f'The vocabulary has duplicate words, e.g. {duplicates}.')
    initializer = tf.lookup.KeyValueTensorInitializer(
        tf.constant(vocab, tf.string), tf.range(len(vocab), dtype=tf.int64)
    )
    return tf.lookup.StaticVocabularyTable(initializer, num_oov_buckets=num_oov_buckets)


class TokenIdEncoder:
    """Turns examples (strings of space-separated tokens) into `(x, y)` id matrices.

    Args:
      vocab: The V in-vocabulary words.
      num_oov_buckets: B.
      max_sequence_length: L, tokens kept per example (longer ones are truncated, EOS then dropped).
    """

    def __init__(self, vocab: Sequence[str], num_oov_buckets: int, max_sequence_length: int = 20):
        if max_sequence_length < 1:
            raise TextPipelineError(f'max_sequence_length must be >= 1, got {max_sequence_length}.')
        self._table = build_vocab_table(vocab, num_oov_buckets)
        self.layout = TokenLayout(len(vocab), num_oov_buckets)
        self.max_sequence_length = max_sequence_length

    def ids(self, examples: Sequence[str]) -> np.ndarray:
        """int64 `[n, L + 1]`: BOS, token ids, EOS (if room), pads."""
        layout, length = self.layout, self.max_sequence_length
        if not len(examples):
            return np.zeros((0, length + 1), np.int64)
        words = tf.strings.split(tf.constant(list(examples), tf.string))[:, :length]
        raw = tf.ragged.map_flat_values(self._table.lookup, words)
        ids = tf.ragged.map_flat_values(
            lambda r: tf.where(r < layout.vocab_size, r + 1, r + (layout.oov_start - layout.vocab_size)), raw
        )
        n = tf.shape(ids.row_lengths())[0]
        bos = tf.fill([n, 1], tf.constant(layout.bos, tf.int64))
        needs_eos = ids.row_lengths() < length
        eos = tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.reduce_sum(tf.cast(needs_eos, tf.int32))], tf.constant(layout.eos, tf.int64)),
            tf.cast(needs_eos, tf.int64),
        )
        sequences = tf.concat([tf.RaggedTensor.from_tensor(bos), ids, eos], axis=1)
        return sequences.to_tensor(default_value=layout.pad, shape=[None, length + 1]).numpy()

    def encode(self, examples: Sequence[str]) -> dict[str, np.ndarray]:
        """`{'x': ids[:, :-1], 'y': ids[:, 1:]}` (int64 `[n, L]` each)."""
        ids = self.ids(examples)
        return {'x': ids[:, :-1], 'y': ids[:, 1:]}


def encode_clients(
    clients: Mapping[str, Sequence[str]],
    encoder: TokenIdEncoder,
    *,
    max_examples_per_client: int | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """Encodes every client's first `max_examples_per_client` examples (time order is kept).

    Raises:
      TextPipelineError: a client has no examples or a non-string example (names the client).
    """
    encoded = {}
    for client_id, examples in clients.items():
        examples = list(examples)[:max_examples_per_client]
        if not examples:
            raise TextPipelineError(f'Client {client_id!r} has no examples.')
        bad = next((e for e in examples if not isinstance(e, str)), None)
        if bad is not None:
            raise TextPipelineError(f'Client {client_id!r} has a non-string example: {bad!r}.')
        encoded[client_id] = encoder.encode(examples)
    return encoded


def to_client_data(encoded: Mapping[str, Mapping[str, np.ndarray]]):
    """A `tff.simulation.datasets.ClientData` of unbatched `{'x', 'y'}` int64 `[L]` elements, in time order."""
    import tensorflow_federated as tff  # Lazy: TFF takes ~10 s to import.

    if not encoded:
        raise TextPipelineError('No clients to build ClientData from.')
    return tff.simulation.datasets.TestClientData({cid: dict(arrays) for cid, arrays in encoded.items()})


def token_statistics(encoded: Mapping[str, Mapping[str, np.ndarray]], layout: TokenLayout) -> dict[str, float]:
    """Fractions of target tokens that are OOV / EOS, over all clients (pads excluded)."""
    labels = np.concatenate([arrays['y'].reshape(-1) for arrays in encoded.values()]) if encoded else np.zeros(0)
    labels = labels[labels != layout.pad]
    total = max(len(labels), 1)
    return {
        'target_tokens': int(len(labels)),
        'oov_fraction': float(np.mean(labels >= layout.oov_start)) if len(labels) else 0.0,
        'eos_fraction': float(np.sum(labels == layout.eos) / total),
    }
