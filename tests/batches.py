"""Comparing lists of batches as tf.data yields them: same structure, dtypes, shapes and values, bit for bit."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf


def assert_same_batches(got: list[Any] | None, want: list[Any]) -> None:
    """`got` is `want`: as many batches, each of the same structure, every leaf of the same dtype, shape and values."""
    assert got is not None
    assert len(got) == len(want)
    for a, b in zip(got, want):
        tf.nest.assert_same_structure(a, b)
        for u, v in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
            u, v = np.asarray(u), np.asarray(v)
            assert u.dtype == v.dtype and u.shape == v.shape
            np.testing.assert_array_equal(u, v)
