"""PFLlib's benchmark data: its label-skew partitions of an image dataset, drawn as PFLlib draws them.

PFLlib (Zhang et al., JMLR 2025; github TsingZ0/PFLlib) builds each leaderboard dataset with
``dataset/generate_<NAME>.py`` and ``dataset/utils/dataset_utils.py``: it seeds numpy's global state
(``np.random.seed(1)``), pools the train and test splits (train first, file order), partitions the pooled rows
over 20 clients (``separate_data``), splits every client's rows 75/25 into train and test (``split_data``, sklearn's
``train_test_split`` on the same global state) and normalizes pixels to ``(x - 0.5) / 0.5``. `federate` does the
same with `fedpersonal.data.partition`:

===================  ===========================================  ==============================================
setting              PFLlib command                               here
===================  ===========================================  ==============================================
``'pathological'``   ``generate_FashionMNIST.py noniid - pat``    `partition.pathological`, 2 classes per client
``'dirichlet'``      ``generate_FashionMNIST.py noniid - dir``    `partition.dirichlet`, alpha 0.1
``'iid'``            ``generate_FashionMNIST.py iid - -``         `partition.pathological` with every class
===================  ===========================================  ==============================================

PFLlib's settings: ``num_clients=20``, ``balance=False`` (the ``-``), ``class_per_client=2``, ``alpha=0.1``,
``batch_size=10``, ``train_ratio=0.75`` and ``least_samples = int(min(batch_size / (1 - train_ratio), N /
num_clients / 2))`` (40 for 70,000 rows).

Exactness: with ``legacy=True`` (the default) the draws come from ``np.random.RandomState(seed)`` in PFLlib's order,
so ``seed=1`` gives PFLlib's own partition and split. Checked against the partition PFLlib ships in its repository
(``dataset/MNIST``: MNIST, ``noniid - dir``): every client's label counts (its ``config.json``) and the labels of
clients 0, 1 and 5 in train and test order (its ``.npz`` files) are equal (``tests/data/pfllib_test.py``).
``legacy=False`` draws the same algorithm from ``np.random.default_rng(seed)``: different partitions, the same
distribution. Differences from PFLlib's code are listed in `fedpersonal.data.partition`; here in addition:
images stay ``[n, 28, 28, 1]`` (PFLlib: ``[n, 1, 28, 28]``), and the pooled rows must be in the files' order (as
`image_datasets.load_idx_dataset` and `fedpersonal.data.tfds_sources` give them; torchvision reads the same files
in the same order).

Small clients: PFLlib trains with ``DataLoader(drop_last=True)``, so a client's last partial train batch is never
trained on and a client with fewer train rows than a batch never trains at all, while it is still evaluated.
`partition_like_pfllib` refuses a partition leaving a client fewer than ``min_train_rows`` train rows
(`TooFewTrainRowsError`, naming the clients; the benchmark passes its batch size), and `partial_batches` counts the
rows of the last partial batches.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedpersonal import errors
from fedpersonal.data import client_data as client_data_lib
from fedpersonal.data import image_datasets
from fedpersonal.data import partition as partition_lib

__all__ = [
    'SETTINGS',
    'PfllibPartition',
    'PfllibImageData',
    'TooFewTrainRowsError',
    'least_samples',
    'partition_like_pfllib',
    'partial_batches',
    'check_train_rows',
    'federate',
]

SETTINGS = ('pathological', 'dirichlet', 'iid')
NUM_CLIENTS = 20
CLASS_PER_CLIENT = 2
ALPHA = 0.1
BATCH_SIZE = 10
TRAIN_RATIO = 0.75
SEED = 1


def least_samples(num_rows: int, num_clients: int, batch_size: int = BATCH_SIZE, train_ratio: float = TRAIN_RATIO):
    """PFLlib's minimum rows per client: one test batch, at most half a client's even share."""
    return int(min(batch_size / (1 - train_ratio), num_rows / num_clients / 2))


class TooFewTrainRowsError(errors.DataError):
    """Clients with fewer train rows than one batch: dropping a last partial batch, they would never train.

    Attributes:
      client_ids: The clients (``'0'``, ``'1'``, ...).
      train_rows: Their train rows, in the same order.
      min_train_rows: The batch size.
    """

    def __init__(self, message: str, *, client_ids: Sequence[str], train_rows: Sequence[int], min_train_rows: int):
        super().__init__(message)
        self.client_ids, self.train_rows, self.min_train_rows = list(client_ids), list(train_rows), min_train_rows


def check_train_rows(train_rows: Sequence[int], min_train_rows: int) -> None:
    """Raises `TooFewTrainRowsError` naming every client with fewer than `min_train_rows` train rows.

    Args:
      train_rows: Each client's number of train rows (client ids are the positions).
      min_train_rows: One batch: a client with fewer never trains when partial batches are dropped.
    """
    rows = np.asarray(train_rows, dtype=np.int64)
    short = np.flatnonzero(rows < min_train_rows)
    if not short.size:
        return
    ids, counts = [str(c) for c in short], [int(rows[c]) for c in short]
    named = ', '.join(f'{c} ({n})' for c, n in list(zip(ids, counts))[:20])
    named += f' and {len(ids) - 20} more' if len(ids) > 20 else ''
    fits = int(rows.min())
    batch_hint = f'a batch_size of at most {fits}, ' if fits >= 1 else ''
    raise TooFewTrainRowsError(
        f'{len(ids)} of {rows.size} clients have fewer train rows than one batch of {min_train_rows}: client (train '
        f"rows) {named}. A last partial batch is dropped (PFLlib's DataLoader drop_last), so they would never train "
        f'yet be evaluated. Use fewer clients (num_clients), {batch_hint}or more rows.',
        client_ids=ids,
        train_rows=counts,
        min_train_rows=min_train_rows,
    )


def partial_batches(train_rows: Sequence[int], batch_size: int) -> dict[str, int]:
    """The train rows in the clients' last partial batches, which a run dropping them never trains on.

    Example:

    >>> partial_batches([25, 30, 12], batch_size=10)
    {'train_rows': 67, 'dropped_train_rows': 7, 'clients_with_dropped_rows': 2}
    """
    rows = np.asarray(train_rows, dtype=np.int64)
    dropped = rows % batch_size
    return {
        'train_rows': int(rows.sum()),
        'dropped_train_rows': int(dropped.sum()),
        'clients_with_dropped_rows': int(np.count_nonzero(dropped)),
    }


@dataclasses.dataclass(frozen=True)
class PfllibPartition:
    """Rows of the pooled table per client.

    Attributes:
        train: int64 row indices per client (in PFLlib's order: the client's train rows as saved).
        test: The same for test.
        label_counts: int64 ``[num_clients, num_classes]`` rows of each class per client, train and test together
            (PFLlib's ``statistic``, dense).
        settings: The arguments that drew it.
    """

    train: list[np.ndarray]
    test: list[np.ndarray]
    label_counts: np.ndarray
    settings: dict[str, Any]


def partition_like_pfllib(
    labels: np.ndarray,
    setting: str,
    *,
    num_clients: int = NUM_CLIENTS,
    balance: bool = False,
    class_per_client: int = CLASS_PER_CLIENT,
    alpha: float = ALPHA,
    batch_size: int = BATCH_SIZE,
    train_ratio: float = TRAIN_RATIO,
    seed: int = SEED,
    legacy: bool = True,
    num_classes: int | None = None,
    min_train_rows: int = 1,
) -> PfllibPartition:
    """PFLlib's ``separate_data`` then ``split_data`` on `labels` (the pooled rows, in PFLlib's order).

    Args:
        labels: int ``[N]`` class of each pooled row.
        setting: One of `SETTINGS`.
        num_clients: Clients.
        balance: PFLlib's ``balance`` (equal pieces in ``'pathological'`` and ``'iid'``; unused by ``'dirichlet'``).
        class_per_client: Classes per client of ``'pathological'``.
        alpha: Dirichlet concentration of ``'dirichlet'``.
        batch_size: Enters `least_samples`.
        train_ratio: Each client's train share.
        seed: Seed (PFLlib: 1).
        legacy: Draw from ``np.random.RandomState(seed)`` (PFLlib's exact numbers) instead of a ``Generator``.
        num_classes: Classes (default ``max(labels) + 1``).
        min_train_rows: The fewest train rows a client may get (a batch, where partial batches are dropped).

    Returns:
        The partition and its split.

    Raises:
        ConfigError: Unknown `setting` or bad counts (see `fedpersonal.data.partition`).
        DataError: Labels that cannot be partitioned so.
        TooFewTrainRowsError: A client would get fewer than `min_train_rows` train rows (checked before the split;
            its train part is ``floor(train_ratio * rows)``).
    """
    if setting not in SETTINGS:
        raise errors.ConfigError(f'setting must be one of {SETTINGS}, got {setting!r}')
    labels = np.asarray(labels)
    rng = partition_lib.make_rng(seed, legacy=legacy)
    least = least_samples(labels.size, num_clients, batch_size, train_ratio)
    k = int(np.max(labels)) + 1 if num_classes is None and labels.size else num_classes
    if setting == 'dirichlet':
        parts = partition_lib.dirichlet(labels, num_clients, alpha, rng=rng, least_samples=least, num_classes=k)
    else:
        per_client = class_per_client if setting == 'pathological' else int(k or 0)
        parts = partition_lib.pathological(
            labels, num_clients, per_client, rng=rng, balance=balance, least_samples=least, num_classes=k
        )
    check_train_rows([math.floor(train_ratio * len(p)) for p in parts], min_train_rows)  # As the split sizes them.
    train, test = partition_lib.train_test_split(parts, train_ratio, rng=rng)
    settings = dict(
        setting=setting,
        num_clients=num_clients,
        balance=balance,
        class_per_client=class_per_client,
        alpha=alpha,
        batch_size=batch_size,
        train_ratio=train_ratio,
        least_samples=least,
        seed=seed,
        legacy=legacy,
    )
    return PfllibPartition(train, test, partition_lib.label_counts(labels, parts, k), settings)


@dataclasses.dataclass(frozen=True, eq=False)
class PfllibImageData:
    """A pooled image table and its PFLlib partition.

    Attributes:
        name: The source dataset's name (e.g. ``'fashion_mnist'``).
        x: float32 ``[N, h, w, c]``, ``(pixel - 0.5) / 0.5`` in [-1, 1] (PFLlib's ``Normalize([0.5], [0.5])``).
        y: int32 ``[N]``.
        partition: Train and test rows per client.
        num_classes: Classes.
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    partition: PfllibPartition
    num_classes: int = 10

    @property
    def client_ids(self) -> list[str]:
        return [str(c) for c in range(len(self.partition.train))]

    def client_data(self, split: str = 'train'):
        """A `tff.simulation.datasets.ClientData` of ``OrderedDict(x=image, y=label)``, clients ``'0'``..."""
        if split not in ('train', 'test'):
            raise errors.ConfigError(f"split must be 'train' or 'test', got {split!r}")
        rows = self.partition.train if split == 'train' else self.partition.test
        return client_data_lib.from_partition(collections.OrderedDict(x=self.x, y=self.y), rows, self.client_ids)

    def statistics(self) -> dict[str, Any]:
        train = np.array([r.size for r in self.partition.train])
        test = np.array([r.size for r in self.partition.test])
        counts = self.partition.label_counts
        return {
            'dataset': self.name,
            **self.partition.settings,
            'train_examples': int(train.sum()),
            'test_examples': int(test.sum()),
            'examples_per_client_min': int((train + test).min()),
            'examples_per_client_max': int((train + test).max()),
            'classes_per_client_max': int((counts > 0).sum(axis=1).max()),
            'label_counts': counts.tolist(),
        }


def federate(dataset: image_datasets.ImageDataset, setting: str, **kwargs: Any) -> PfllibImageData:
    """PFLlib's clients of `dataset`: train and test pooled (train first), partitioned by `partition_like_pfllib`.

    Args:
        dataset: Source images (file order), e.g. ``image_datasets.load_idx_dataset(FASHION_MNIST_DIR)``.
        setting: One of `SETTINGS`.
        **kwargs: Passed to `partition_like_pfllib` (PFLlib's values by default).
    """
    x = np.concatenate([dataset.train_images, dataset.test_images])
    y = np.concatenate([dataset.train_labels, dataset.test_labels]).astype(np.int32)
    kwargs.setdefault('num_classes', dataset.num_classes)
    parts = partition_like_pfllib(y, setting, **kwargs)
    x = ((x - np.float32(0.5)) / np.float32(0.5)).astype(np.float32)
    return PfllibImageData(dataset.name, x, y, parts, dataset.num_classes)
