"""A tiny next-word task shared by the engine tests: token layout, model function and unequal client datasets."""

import collections

import numpy as np
import tensorflow as tf

from fedpersonal.data import text_pipeline
from fedpersonal.models import next_word_prediction as nwp

LAYOUT = text_pipeline.TokenLayout(vocab_size=6, num_oov_buckets=2)


# An LSTM next-word model function with local OOV embeddings (sequence length 5).
model_fn = nwp.model_fn(LAYOUT, max_sequence_length=5, embedding_dim=4, lstm_units=5, seed=0)


def client_datasets(sizes=(8, 3, 1, 11), seed=4, batch=4) -> list[tf.data.Dataset]:
    """Clients of `sizes` sequences (some padded at the end), batched."""
    rng = np.random.default_rng(seed)
    datasets = []
    for n in sizes:
        ids = rng.integers(1, LAYOUT.num_classes, size=[n, 6]).astype(np.int64)
        ids[:, -2:] *= rng.integers(0, 2, size=[n, 1])  # Padded sequences.
        datasets.append(
            tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=ids[:, :-1], y=ids[:, 1:])).batch(batch)
        )
    return datasets
