"""Common format of the FURL document-classification tasks (Bui et al. 2019, Section 4.1).

Three datasets produce the same kind of data (see `movielens_likes`, `assistments`, `synthetic_subreddit`): users
are clients, and each user's examples are *unbatched* ``collections.OrderedDict`` elements

* ``user_id``: int64 scalar, the dense 0-based user index (also the client id, as a string);
* ``chars``: int32 ``[max_chars]``, character ids of the example's text (0 = padding, 1 = unknown character);
* ``features``: float32 ``[num_features]``, dataset-specific side features (``[0]`` when there are none);
* ``label``: int64 scalar in ``[0, num_classes)``;
* ``item_id``: int64 scalar, the dense 0-based item index -- only when ``FurlData.num_items > 0`` (ASSISTments
  always, MovieLens-likes on request), and then it is the last key.

Splits. Each user's examples are ordered (by time where the data has it, else in a documented order; or, with
``split_order='random'``, by a seeded permutation) and split 0.8 / 0.1 / 0.1 into train / eval / test as in the paper
("Each user's data is split (0.8/0.1/0.1)"). Every user has at least one example in every split, so the *same*
users are in train, eval and test: FURL evaluates seen users with their private embeddings. For a user with ``n``
examples (``n >= 3`` is required): ``n_eval = max(floor(0.1 n), 1)``, ``n_test = max(n - floor(0.8 n) - n_eval, 1)``
-> ``n_train = n - n_eval - n_test`` (n=3 -> 1/1/1, n=16 -> 12/1/3, n=20 -> 16/2/2, n=100 -> 80/10/10).

Characters. A char -> id map is built from the *train* text only (lowercased): id 0 is padding, id 1 the reserved
id of characters not seen in train text, ids 2..V-1 the train characters in code-point order (V =
``char_vocab_size``). Texts are lowercased, truncated to ``max_chars`` characters and right-padded with 0.

Storage. Examples are kept as index arrays into a per-dataset *document table* (one row of chars and features per
distinct document: a movie, an exercise, a comment), so memory stays small and the TFF-traceable path of the
`ClientData` embeds only the tables and the index arrays.

Importing this module does not import TensorFlow; building a `FurlData` does.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import numpy as np

from fedpersonal import errors
from fedpersonal.data import interaction_splits

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow_federated as tff

__all__ = [
    'PAD_ID',
    'OOV_ID',
    'SPLITS',
    'EXAMPLE_KEYS',
    'FurlData',
    'build_char_vocab',
    'encode_texts',
    'split_sizes',
    'build_furl_data',
]

PAD_ID = 0
"""Character id of padding."""
OOV_ID = 1
"""Character id of characters not in the (train) vocabulary."""
SPLITS = ('train', 'eval', 'test')
EXAMPLE_KEYS = ('user_id', 'chars', 'features', 'label')
"""Keys of every example, in order; ``item_id`` follows when the dataset has items."""
SPLIT_ORDERS = ('time', 'random')


# ----------------------------------------------------------------------------------------------------------------
# Characters.
# ----------------------------------------------------------------------------------------------------------------


def build_char_vocab(texts: Sequence[str]) -> dict[str, int]:
    """Char -> id map of the lowercased `texts`: ids 2..V-1 in code-point order (0 = padding, 1 = unknown)."""
    chars = sorted(set(''.join(texts).lower()))
    return {c: i + 2 for i, c in enumerate(chars)}


def encode_texts(texts: Sequence[str], vocab: dict[str, int], max_chars: int) -> np.ndarray:
    """Encodes lowercased, truncated, right-padded `texts` as int32 ``[len(texts), max_chars]`` char ids.

    Characters not in `vocab` map to `OOV_ID`; NUL characters are treated as padding.
    """
    if max_chars < 0:
        raise errors.ConfigError(f'max_chars must be >= 0, got {max_chars}')
    n = len(texts)
    if max_chars == 0 or n == 0:
        return np.zeros((n, max_chars), dtype=np.int32)
    # A fixed-width unicode array truncates to max_chars and pads with NUL; its UTF-32 view holds the code points.
    fixed = np.asarray([t.lower() for t in texts], dtype=f'<U{max_chars}')
    points = fixed.view(np.uint32).reshape(n, max_chars)
    unique, inverse = np.unique(points, return_inverse=True)
    ids = np.array([PAD_ID if p == 0 else vocab.get(chr(p), OOV_ID) for p in unique], dtype=np.int32)
    return ids[inverse].reshape(n, max_chars)


# ----------------------------------------------------------------------------------------------------------------
# Splits.
# ----------------------------------------------------------------------------------------------------------------


def split_sizes(
    counts: np.ndarray, train_fraction: float = 0.8, eval_fraction: float = 0.1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-user (train, eval, test) sizes; every part gets >= 1 example (counts must be >= 3). See module doc."""
    n = np.asarray(counts, dtype=np.int64)
    if n.size and n.min() < 3:
        raise errors.DataError(
            f'every user needs at least 3 examples to appear in train, eval and test; found a user with {int(n.min())}'
        )
    n_train_raw = np.floor(n * train_fraction + 1e-9).astype(np.int64)
    n_eval = np.maximum(np.floor(n * eval_fraction + 1e-9).astype(np.int64), 1)
    n_test = np.maximum(n - n_train_raw - n_eval, 1)
    n_train = n - n_eval - n_test
    return n_train, n_eval, n_test


# ----------------------------------------------------------------------------------------------------------------
# The dataset container.
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class _SplitIndex:
    """Rows of one split, sorted by user then by the user's example order."""

    user_id: np.ndarray  # int64 [N]
    doc_index: np.ndarray  # int64 [N], row of the document table
    label: np.ndarray  # int64 [N]
    item_id: np.ndarray | None  # int64 [N] or None


@dataclasses.dataclass(frozen=True, eq=False)
class FurlData:
    """A FURL task: per-user train / eval / test `ClientData` and what a model needs to know about it.

    Attributes:
        train, eval, test: `tff.simulation.datasets.ClientData`; client ids are ``str(user index)`` for every user in
            ``range(num_users)`` (the same users in all three), elements as described in the module docstring.
        num_users: Number of users (clients).
        num_classes: Number of label classes (2 for binary tasks).
        char_vocab_size: Number of character ids including padding (0) and unknown (1).
        max_chars: Length of ``chars`` (0 when the dataset has no text).
        num_features: Length of ``features``.
        num_items: Number of distinct items when examples carry ``item_id``, else 0.
        description: Human-readable description of the task and its provenance.
        user_positive_rate: float64 ``[num_users]``: per user, the fraction of positive labels in train (binary), or
            the share of the user's most frequent train class (multiclass).
        char_vocab: The char -> id map (ids >= 2).
        user_ids: int64 ``[num_users]``: the original id of each dense user index (dataset's own ids).
        name: Short dataset name.
    """

    train: tff.simulation.datasets.ClientData
    eval: tff.simulation.datasets.ClientData
    test: tff.simulation.datasets.ClientData
    num_users: int
    num_classes: int
    char_vocab_size: int
    max_chars: int
    num_features: int
    num_items: int
    description: str
    user_positive_rate: np.ndarray
    char_vocab: dict[str, int]
    user_ids: np.ndarray
    name: str
    _doc_chars: np.ndarray = dataclasses.field(repr=False)
    _doc_features: np.ndarray = dataclasses.field(repr=False)
    _splits: dict[str, _SplitIndex] = dataclasses.field(repr=False)

    @property
    def client_ids(self) -> list[str]:
        """``[str(u) for u in range(num_users)]``."""
        return [str(u) for u in range(self.num_users)]

    def client_data(self, split: str) -> tff.simulation.datasets.ClientData:
        """The `ClientData` of `split` (``'train'``, ``'eval'`` or ``'test'``)."""
        _check_split(split)
        return getattr(self, split)

    def arrays(self, split: str) -> collections.OrderedDict:
        """All examples of `split` as numpy arrays in example format (rows sorted by user, then example order).

        Useful for centralized ("Server") training: ``tf.data.Dataset.from_tensor_slices(data.arrays('train'))``.
        """
        _check_split(split)
        return _gather(self._splits[split], self._doc_chars, self._doc_features, slice(None))

    def num_examples(self, split: str) -> int:
        _check_split(split)
        return int(self._splits[split].label.size)

    def examples_per_user(self, split: str) -> np.ndarray:
        """int64 ``[num_users]``: number of examples of each user in `split`."""
        _check_split(split)
        return np.bincount(self._splits[split].user_id, minlength=self.num_users).astype(np.int64)

    def model_kwargs(self) -> dict[str, int]:
        """Keyword arguments describing the inputs, for `fedpersonal.models.furl_models.furl_model_fn`."""
        return dict(
            char_vocab_size=self.char_vocab_size,
            max_chars=self.max_chars,
            num_features=self.num_features,
            num_classes=self.num_classes,
            num_items=self.num_items,
            num_users=self.num_users,
        )

    def statistics(self) -> dict[str, Any]:
        """Python-scalar summary: users, examples per split, classes, label shares, per-user sizes and rates."""
        train_labels = self._splits['train'].label
        all_labels = np.concatenate([self._splits[s].label for s in SPLITS])
        per_user = np.sum([self.examples_per_user(s) for s in SPLITS], axis=0)
        stats: dict[str, Any] = {
            'name': self.name,
            'num_users': self.num_users,
            'num_classes': self.num_classes,
            'num_features': self.num_features,
            'num_items': self.num_items,
            'max_chars': self.max_chars,
            'char_vocab_size': self.char_vocab_size,
            'num_examples': int(all_labels.size),
        }
        for split in SPLITS:
            stats[f'num_{split}_examples'] = self.num_examples(split)
        stats['examples_per_user_min'] = int(per_user.min())
        stats['examples_per_user_median'] = float(np.median(per_user))
        stats['examples_per_user_max'] = int(per_user.max())
        counts = np.bincount(all_labels, minlength=self.num_classes)
        if self.num_classes == 2:
            stats['positive_rate'] = float(all_labels.mean())
            stats['train_positive_rate'] = float(train_labels.mean())
        stats['majority_class_rate'] = float(counts.max() / counts.sum())
        stats['user_positive_rate_mean'] = float(self.user_positive_rate.mean())
        stats['user_positive_rate_std'] = float(self.user_positive_rate.std())
        return stats


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise errors.ConfigError(f'split must be one of {SPLITS}, got {split!r}')


def _gather(index: _SplitIndex, doc_chars: np.ndarray, doc_features: np.ndarray, rows) -> collections.OrderedDict:
    docs = index.doc_index[rows]
    out = collections.OrderedDict(
        user_id=index.user_id[rows],
        chars=doc_chars[docs],
        features=doc_features[docs],
        label=index.label[rows],
    )
    if index.item_id is not None:
        out['item_id'] = index.item_id[rows]
    return out


def _to_client_data(
    index: _SplitIndex, doc_chars: np.ndarray, doc_features: np.ndarray, num_users: int
) -> tff.simulation.datasets.ClientData:
    """An in-memory `ClientData` (one client per user, ids ``str(u)``), traceable by TF/TFF."""
    import tensorflow as tf  # Lazy: loading and preprocessing do not need TensorFlow.
    import tensorflow_federated as tff

    counts = np.bincount(index.user_id, minlength=num_users).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    client_ids = [str(u) for u in range(num_users)]
    has_items = index.item_id is not None

    def serializable_dataset_fn(client_id):
        if isinstance(client_id, bytes):
            client_id = client_id.decode('utf-8')
        if isinstance(client_id, str):
            # Python path: gather this user's rows with numpy (on demand: the full arrays are never materialized).
            if not client_id.isdigit() or int(client_id) >= num_users:
                raise errors.ConfigError(f'unknown client id {client_id!r} (client ids are "0".."{num_users - 1}")')
            u = int(client_id)
            rows = slice(int(offsets[u]), int(offsets[u] + counts[u]))
            return tf.data.Dataset.from_tensor_slices(_gather(index, doc_chars, doc_features, rows))
        # Graph path (tf.function / TFF): slice constant index arrays and gather from the document tables.
        u = tf.strings.to_number(client_id, out_type=tf.int64)
        with tf.control_dependencies(
            [tf.debugging.assert_less(u, tf.constant(num_users, tf.int64), message='unknown client id')]
        ):
            u = tf.identity(u)
        start = tf.gather(tf.constant(offsets), u)
        stop = start + tf.gather(tf.constant(counts), u)
        columns = collections.OrderedDict(
            user_id=tf.constant(index.user_id)[start:stop],
            doc_index=tf.constant(index.doc_index)[start:stop],
            label=tf.constant(index.label)[start:stop],
        )
        if has_items:
            columns['item_id'] = tf.constant(index.item_id)[start:stop]
        chars_table = tf.constant(doc_chars)
        features_table = tf.constant(doc_features)

        def to_example(row):
            out = collections.OrderedDict(
                user_id=row['user_id'],
                chars=tf.gather(chars_table, row['doc_index']),
                features=tf.gather(features_table, row['doc_index']),
                label=row['label'],
            )
            if has_items:
                out['item_id'] = row['item_id']
            return out

        return tf.data.Dataset.from_tensor_slices(columns).map(to_example)

    return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(client_ids, serializable_dataset_fn)


def build_furl_data(
    *,
    name: str,
    description: str,
    user_id: np.ndarray,
    order_key: np.ndarray,
    doc_index: np.ndarray,
    label: np.ndarray,
    doc_texts: Sequence[str] | None,
    doc_features: np.ndarray,
    num_classes: int,
    max_chars: int,
    user_ids: np.ndarray,
    item_id: np.ndarray | None = None,
    num_items: int = 0,
    split_order: str = 'time',
    seed: int = 0,
    source: str | None = None,
    item_name: str = 'items',
) -> FurlData:
    """Splits per-example arrays per user and builds a `FurlData` (used by the three dataset modules).

    Args:
        name: Short dataset name.
        description: Description stored in the result.
        user_id: int ``[N]`` dense user indices in ``[0, len(user_ids))``; every user must have >= 3 examples.
        order_key: ``[N]`` sort key of a user's examples ("time"); ties keep the input order (stable sort).
        doc_index: int ``[N]`` row of each example in the document tables.
        label: int ``[N]`` labels in ``[0, num_classes)``.
        doc_texts: ``[D]`` text of each document, or None when there is no text (then `max_chars` must be 0).
        doc_features: float ``[D, F]`` side features of each document.
        num_classes: Number of classes.
        max_chars: Text length.
        user_ids: Original id of each dense user index.
        item_id: Optional int ``[N]`` dense item index of each example (adds ``item_id`` to the examples).
        num_items: Number of items (required > 0 with `item_id`).
        split_order: ``'time'``: order each user's examples by `order_key`; ``'random'``: a permutation seeded by
            `seed` (the same for every call with that seed).
        seed: Seed of the ``'random'`` order.
        source: Names the data in the warning about test items never seen in training (default `name`).
        item_name: What the documents are, for that warning (e.g. ``'movies'``).
    """
    if split_order not in SPLIT_ORDERS:
        raise errors.ConfigError(f'split_order must be one of {SPLIT_ORDERS}, got {split_order!r}')
    num_users = int(len(user_ids))
    user_id = np.asarray(user_id, dtype=np.int64)
    label = np.asarray(label, dtype=np.int64)
    doc_index = np.asarray(doc_index, dtype=np.int64)
    if label.size and (label.min() < 0 or label.max() >= num_classes):
        raise errors.DataError(f'labels must be in [0, {num_classes}), found {label.min()}..{label.max()}')
    if item_id is not None and num_items <= 0:
        raise errors.ConfigError('num_items must be > 0 when item_id is given')
    if doc_texts is None and max_chars != 0:
        raise errors.ConfigError('max_chars must be 0 when the dataset has no text')

    if split_order == 'time':
        secondary = np.asarray(order_key)
    else:
        secondary = np.random.default_rng(seed).permutation(user_id.size)
    order = np.lexsort((np.arange(user_id.size), secondary, user_id))  # stable: ties keep input order
    user_id, doc_index, label = user_id[order], doc_index[order], label[order]
    if item_id is not None:
        item_id = np.asarray(item_id, dtype=np.int64)[order]

    counts = np.bincount(user_id, minlength=num_users)
    if counts.size != num_users or (counts == 0).any():
        raise errors.DataError('every user index in [0, num_users) needs examples')
    n_train, n_eval, _ = split_sizes(counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.arange(user_id.size) - np.repeat(starts, counts)
    part = np.where(
        position < np.repeat(n_train, counts), 0, np.where(position < np.repeat(n_train + n_eval, counts), 1, 2)
    )

    interaction_splits.warn_unseen_in_training(
        doc_index,
        part,
        source=source or name,
        what=item_name,
        consequence=(
            'a model knows them only by their text and features'
            if item_id is None
            else 'their item embeddings stay untrained'
        ),
    )
    splits = {}
    for k, split in enumerate(SPLITS):
        mask = part == k
        splits[split] = _SplitIndex(
            user_id=user_id[mask],
            doc_index=doc_index[mask],
            label=label[mask],
            item_id=None if item_id is None else item_id[mask],
        )

    train_docs = np.unique(splits['train'].doc_index)
    if doc_texts is None:
        vocab: dict[str, int] = {}
        doc_chars = np.zeros((len(doc_features), 0), dtype=np.int32)
    else:
        vocab = build_char_vocab([doc_texts[int(d)] for d in train_docs])
        doc_chars = encode_texts(doc_texts, vocab, max_chars)
    doc_features = np.asarray(doc_features, dtype=np.float32)

    train = splits['train']
    if num_classes == 2:
        positives = np.bincount(train.user_id, weights=train.label, minlength=num_users)
        user_rate = positives / np.bincount(train.user_id, minlength=num_users)
    else:
        joint = np.zeros((num_users, num_classes), dtype=np.int64)
        np.add.at(joint, (train.user_id, train.label), 1)
        user_rate = joint.max(axis=1) / joint.sum(axis=1)

    client_data = {split: _to_client_data(splits[split], doc_chars, doc_features, num_users) for split in SPLITS}
    return FurlData(
        train=client_data['train'],
        eval=client_data['eval'],
        test=client_data['test'],
        num_users=num_users,
        num_classes=int(num_classes),
        char_vocab_size=len(vocab) + 2,
        max_chars=int(max_chars),
        num_features=int(doc_features.shape[1]),
        num_items=int(num_items) if item_id is not None else 0,
        description=description,
        user_positive_rate=user_rate.astype(np.float64),
        char_vocab=vocab,
        user_ids=np.asarray(user_ids, dtype=np.int64),
        name=name,
        _doc_chars=doc_chars,
        _doc_features=doc_features,
        _splits=splits,
    )
