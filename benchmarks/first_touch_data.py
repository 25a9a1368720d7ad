"""The ``first_touch`` workload's clients, made from their ids: the one definition every row's process imports.

Imports numpy alone, so the engine's row (the package's venv), pfl-research's and FedJAX's rows (their own venvs,
`peer_pfl_row.py`, `peer_fedjax_row.py`) build the same arrays. A client's data is a function of the workload seed
and its integer id (`client_arrays`): 40 examples of 784 pixel-like features (about a fifth on, in (0, 1)) with a
label 0-9 drawn uniformly, each example carrying its class's fixed pattern (a tenth of the features raised by 0.2),
so training raises the accuracy on the held-out examples (`heldout`, drawn the same way from another stream) and rows
that did the same work end at the same accuracy. Nothing is stored per registered client: a registry of N clients
is their ids, and `schedule` samples each round's cohort from them without reuse across rounds.
"""

from __future__ import annotations

import functools

import numpy as np

EXAMPLES = 40  # Per client.
FEATURES = 784
CLASSES = 10


@functools.cache
def _prototypes(seed: int) -> np.ndarray:
    """Each class's pattern: a fixed random tenth of the features, [10, 784] float32 of 0 or 0.2."""
    return 0.2 * (np.random.default_rng([seed, 2]).random((CLASSES, FEATURES)) < 0.1).astype(np.float32)


def _examples(rng: np.random.Generator, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, CLASSES, n).astype(np.int32)
    x = rng.random((n, FEATURES), np.float32) * (rng.random((n, FEATURES)) < 0.2) + _prototypes(seed)[y]
    return x, y


def client_arrays(client_id: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Client `client_id`'s examples: features [40, 784] float32, labels [40] int32 (0-9); the same every call."""
    return _examples(np.random.default_rng([seed, 0, int(client_id)]), EXAMPLES, seed)


def heldout(seed: int = 0, n: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """The held-out examples every row's final weights are evaluated on (no client has them)."""
    return _examples(np.random.default_rng([seed, 1]), n, seed)


def schedule(registered: int, rounds: int, cohort: int, seed: int = 0) -> np.ndarray:
    """[rounds, cohort] client ids in [0, registered), all distinct: every round's clients are new."""
    if rounds * cohort > registered:
        raise ValueError(f'{rounds} rounds of {cohort} new clients need more than {registered} registered clients.')
    return np.random.default_rng([seed, 3]).choice(registered, rounds * cohort, replace=False).reshape(rounds, cohort)


def fingerprint(client_id: int, seed: int = 0) -> float:
    """A float64 digest of a client's arrays: rows compare it with the workload file's (the same generated data)."""
    x, y = client_arrays(client_id, seed)
    return float(np.sum(x.astype(np.float64) * (1.0 + np.arange(FEATURES))) + np.sum(y * (1.0 + np.arange(len(y)))))


def accuracy(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """The MLP 784-200-200-10's accuracy (Keras layout: kernel, bias per layer; ReLU between), in float64."""
    h = x.astype(np.float64)
    for i in range(0, len(weights), 2):
        h = h @ np.asarray(weights[i], np.float64) + np.asarray(weights[i + 1], np.float64)
        if i + 2 < len(weights):
            h = np.maximum(h, 0.0)
    return float(np.mean(np.argmax(h, axis=1) == y))
