"""The cross-silo user-modeling data format of HPFL (Wu et al., WWW 2021), its validation and statistics.

Each client (a school, a region) is a `ClientSilo` holding many users and items with local indices; records are
``(user, item, label)`` triplets with a per-user train / validation / test ``split``. Items carry multi-hot
attributes over ``K`` attributes shared by all clients (ASSISTments knowledge concepts, MovieLens genres). An attribute
that no item of a silo has is *missing* for that client (HPFL's model heterogeneity: the client contributes nothing to
that attribute's aggregation).

* `validate` checks a `UserModelingData` (dtypes, shapes, index ranges, labels, splits present, no empty silo) and
  raises `UserModelingDataError` naming the silo and the field.
* `statistics` gives the fields of the paper's statistics table (clients, records, users, items, attributes,
  attributes per item, attributes per record) plus per-client distributions and a non-IID measure.
* `attribute_distribution` / `plot_attribute_distribution`: the paper's "distribution of attributes" figure, the
  fraction of each client's records that touch each attribute (IID partitions give near-identical rows).

Loaders: `fedpersonal.data.hpfl_assistments`, `fedpersonal.data.hpfl_movielens`,
`fedpersonal.data.synthetic_user_modeling`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from fedpersonal import errors
from fedpersonal import wording
from fedpersonal.data import furl_tasks

__all__ = [
    'SPLIT_TRAIN',
    'SPLIT_VALIDATION',
    'SPLIT_TEST',
    'TASKS',
    'ClientSilo',
    'UserModelingData',
    'UserModelingDataError',
    'validate',
    'per_user_split',
    'majority_class_accuracy',
    'statistics',
    'attribute_distribution',
    'plot_attribute_distribution',
]

SPLIT_TRAIN = 0
SPLIT_VALIDATION = 1
SPLIT_TEST = 2
TASKS = ('binary', 'rating')


@dataclasses.dataclass(frozen=True)
class ClientSilo:
    """One client (a school, a region): its users, items and records.

    Attributes:
        client_id: e.g. ``'zip_region_5'``, ``'assist_group_03'``.
        num_users: Users of this silo; local user index ``0..num_users-1``.
        num_items: Items seen in this silo; local item index ``0..num_items-1``.
        user: int64 ``[n_records]`` local user index.
        item: int64 ``[n_records]`` local item index.
        label: float32 ``[n_records]``: 0/1 correctness (binary task) or rating 1..5 (rating task).
        split: int8 ``[n_records]``: 0 train, 1 validation, 2 test (per user, time/file order).
        item_attributes: float32 ``[num_items, K]`` multi-hot attributes (ASSIST concepts / ML genres).
        global_user_ids: int64 ``[num_users]`` original dataset ids.
        global_item_ids: int64 ``[num_items]`` original dataset ids.
    """

    client_id: str
    num_users: int
    num_items: int
    user: np.ndarray
    item: np.ndarray
    label: np.ndarray
    split: np.ndarray
    item_attributes: np.ndarray
    global_user_ids: np.ndarray
    global_item_ids: np.ndarray


@dataclasses.dataclass(frozen=True)
class UserModelingData:
    """A cross-silo user-modeling dataset.

    Attributes:
        name: ``'assist_a0910'`` (or ``'assistments:<directory>'``), ``'movielens_100k'``, ``'synthetic_user_modeling'``.
        task: ``'binary'`` or ``'rating'``.
        num_attributes: ``K``.
        attribute_names: ``K`` names.
        rating_range: ``(0, 1)`` for binary, ``(1, 5)`` for ratings.
        silos: The clients.
        source: Path or generator description.
    """

    name: str
    task: str
    num_attributes: int
    attribute_names: list[str]
    rating_range: tuple[float, float]
    silos: list[ClientSilo]
    source: str


class UserModelingDataError(errors.DataError):
    """A `UserModelingData` breaks the format.

    Attributes:
        client_id: The offending silo's id, or None when the problem is dataset-wide.
        field: The offending field (e.g. ``'item'``, ``'item_attributes'``, ``'task'``).
    """

    def __init__(self, message: str, *, client_id: str | None = None, field: str | None = None):
        super().__init__(message)
        self.client_id = client_id
        self.field = field


# ----------------------------------------------------------------------------------------------------------------
# Validation.
# ----------------------------------------------------------------------------------------------------------------

_DTYPES = {
    'user': np.int64,
    'item': np.int64,
    'label': np.float32,
    'split': np.int8,
    'item_attributes': np.float32,
    'global_user_ids': np.int64,
    'global_item_ids': np.int64,
}


def _fail(message: str, client_id: str | None = None, field: str | None = None):
    where = f'silo {client_id!r} field {field!r}' if client_id is not None else f'field {field!r}'
    raise UserModelingDataError(f'{where}: {message}', client_id=client_id, field=field)


def _validate_silo(silo: ClientSilo, data: UserModelingData) -> None:
    cid = silo.client_id
    k = data.num_attributes
    for name in ('num_users', 'num_items'):
        value = getattr(silo, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            _fail(f'must be an int, got {type(value).__name__}', cid, name)
        if value < 1:
            _fail(f'must be >= 1 (no empty silo), got {value}', cid, name)
    for name, dtype in _DTYPES.items():
        value = getattr(silo, name)
        if not isinstance(value, np.ndarray):
            _fail(f'must be a numpy array, got {type(value).__name__}', cid, name)
        if value.dtype != dtype:
            _fail(f'must have dtype {np.dtype(dtype).name}, got {value.dtype.name}', cid, name)
    n = silo.user.shape[0] if silo.user.ndim == 1 else -1
    if n < 1:
        _fail(f'must be a non-empty 1-D array (no empty silo), got shape {silo.user.shape}', cid, 'user')
    for name in ('item', 'label', 'split'):
        if getattr(silo, name).shape != (n,):
            _fail(f'must have shape ({n},) like user, got {getattr(silo, name).shape}', cid, name)
    expected = {
        'item_attributes': (silo.num_items, k),
        'global_user_ids': (silo.num_users,),
        'global_item_ids': (silo.num_items,),
    }
    for name, shape in expected.items():
        if getattr(silo, name).shape != shape:
            _fail(f'must have shape {shape}, got {getattr(silo, name).shape}', cid, name)

    for name, size, what in (('user', silo.num_users, 'num_users'), ('item', silo.num_items, 'num_items')):
        index = getattr(silo, name)
        bad = np.flatnonzero((index < 0) | (index >= size))
        if bad.size:
            _fail(
                f'record {int(bad[0])} has index {int(index[bad[0]])} outside [0, {what}={size}) '
                f'({wording.count(bad.size, "records")} out of range)',
                cid,
                name,
            )
        unused = np.setdiff1d(np.arange(size), index)
        if unused.size:
            _fail(
                f'local index {int(unused[0])} has no record ({unused.size} of {what}={size} unused; '
                f'every user and item of a silo must appear in its records)',
                cid,
                name,
            )

    label = silo.label
    if not np.all(np.isfinite(label)):
        _fail(f'record {int(np.flatnonzero(~np.isfinite(label))[0])} is not finite', cid, 'label')
    if data.task == 'binary':
        bad = np.flatnonzero((label != 0) & (label != 1))
        if bad.size:
            _fail(f'binary task labels must be 0 or 1; record {int(bad[0])} is {float(label[bad[0]]):g}', cid, 'label')
    else:
        lo, hi = data.rating_range
        bad = np.flatnonzero((label < lo) | (label > hi))
        if bad.size:
            _fail(
                f'rating {float(label[bad[0]]):g} of record {int(bad[0])} is outside rating_range {data.rating_range}',
                cid,
                'label',
            )

    bad = np.flatnonzero((silo.split < SPLIT_TRAIN) | (silo.split > SPLIT_TEST))
    if bad.size:
        _fail(
            f'split values must be 0 (train), 1 (validation) or 2 (test); record {int(bad[0])} is '
            f'{int(silo.split[bad[0]])}',
            cid,
            'split',
        )
    for value, split_name in ((SPLIT_TRAIN, 'train'), (SPLIT_VALIDATION, 'validation'), (SPLIT_TEST, 'test')):
        if not np.any(silo.split == value):
            _fail(f'no {split_name} record (split == {value})', cid, 'split')

    attributes = silo.item_attributes
    if not np.all((attributes == 0) | (attributes == 1)):
        _fail('must be multi-hot (every value 0 or 1)', cid, 'item_attributes')
    no_attribute = np.flatnonzero(attributes.sum(axis=1) == 0)
    if no_attribute.size:
        _fail(
            f'item {int(no_attribute[0])} (global id {int(silo.global_item_ids[no_attribute[0]])}) has no '
            f'attribute ({no_attribute.size} such items)',
            cid,
            'item_attributes',
        )
    for name in ('global_user_ids', 'global_item_ids'):
        ids = getattr(silo, name)
        unique, counts = np.unique(ids, return_counts=True)
        if unique.size != ids.size:
            _fail(f'id {int(unique[counts > 1][0])} appears more than once', cid, name)


def validate(data: UserModelingData) -> UserModelingData:
    """Checks that `data` follows the format; returns it unchanged.

    Checks: task and rating range, attribute names, at least one silo, unique client ids, and per silo the dtypes
    and shapes of every array, that user/item indices are in range and every local user and item has a record, labels
    (0/1 for the binary task, within ``rating_range`` for ratings), split values and that every split (train,
    validation, test) is present, multi-hot item attributes with at least one attribute per item, and unique global
    ids.

    Args:
        data: The dataset.

    Returns:
        `data`.

    Raises:
        UserModelingDataError: Naming the silo (``client_id``) and the field.
    """
    if not isinstance(data, UserModelingData):
        raise TypeError(f'data must be a UserModelingData, got {type(data).__name__}')
    if data.task not in TASKS:
        _fail(f'must be one of {TASKS}, got {data.task!r}', field='task')
    expected_range = (0.0, 1.0) if data.task == 'binary' else None
    if len(tuple(data.rating_range)) != 2 or not data.rating_range[0] < data.rating_range[1]:
        _fail(f'must be (low, high) with low < high, got {data.rating_range!r}', field='rating_range')
    if expected_range is not None and tuple(float(v) for v in data.rating_range) != expected_range:
        _fail(f'must be (0, 1) for the binary task, got {data.rating_range!r}', field='rating_range')
    if data.num_attributes < 1:
        _fail(f'must be >= 1, got {data.num_attributes}', field='num_attributes')
    if len(data.attribute_names) != data.num_attributes:
        _fail(
            f'has {len(data.attribute_names)} names for num_attributes={data.num_attributes}', field='attribute_names'
        )
    if not data.silos:
        _fail('no silo', field='silos')
    seen: set[str] = set()
    for silo in data.silos:
        if not isinstance(silo, ClientSilo):
            _fail(f'every silo must be a ClientSilo, got {type(silo).__name__}', field='silos')
        if not isinstance(silo.client_id, str) or not silo.client_id:
            _fail(f'client_id must be a non-empty str, got {silo.client_id!r}', field='client_id')
        if silo.client_id in seen:
            _fail('client_id is used by more than one silo', silo.client_id, 'client_id')
        seen.add(silo.client_id)
        _validate_silo(silo, data)
    return data


def per_user_split(user: np.ndarray, split: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> np.ndarray:
    """Per-user train / validation / test assignment of records given in time order.

    Each user's records are taken in array order (their time or file order); for a user with ``n`` records the
    first ``n_train`` go to train, the next ``n_val`` to validation and the rest to test, with the sizes of
    `fedpersonal.data.furl_tasks.split_sizes`: ``n_val = max(floor(n * split[1]), 1)``,
    ``n_test = max(n - floor(n * split[0]) - n_val, 1)``, ``n_train = n - n_val - n_test`` (so n=3 -> 1/1/1,
    n=10 -> 8/1/1, n=16 -> 12/1/3, n=20 -> 16/2/2). The test fraction is what remains after train and validation.

    Args:
        user: int ``[n_records]`` user index of each record; every user needs >= 3 records.
        split: ``(train, validation, test)`` fractions, each in (0, 1), summing to 1.

    Returns:
        int8 ``[n_records]``: 0 train, 1 validation, 2 test.

    Raises:
        ValueError: Bad fractions, or a user has fewer than 3 records.
    """
    fractions = tuple(float(f) for f in split)
    if len(fractions) != 3 or not all(0.0 < f < 1.0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise errors.ConfigError(
            f'split must be three fractions (train, validation, test) in (0, 1) summing to 1, got {split!r}'
        )
    user = np.asarray(user, dtype=np.int64)
    _, inverse, counts = np.unique(user, return_inverse=True, return_counts=True)
    n_train, n_val, _ = furl_tasks.split_sizes(counts, fractions[0], fractions[1])
    order = np.argsort(inverse, kind='stable')
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.empty(user.size, dtype=np.int64)
    position[order] = np.arange(user.size) - np.repeat(starts, counts)
    out = np.full(user.size, SPLIT_TEST, dtype=np.int8)
    out[position < n_train[inverse] + n_val[inverse]] = SPLIT_VALIDATION
    out[position < n_train[inverse]] = SPLIT_TRAIN
    return out


# ----------------------------------------------------------------------------------------------------------------
# Statistics.
# ----------------------------------------------------------------------------------------------------------------


def majority_class_accuracy(data: UserModelingData) -> float:
    """The accuracy of always predicting the most frequent training label, pooled over the silos.

    Binary task: the share of the majority class (0 or 1) among the training records; rating task: the share of
    the most frequent rounded rating (HPFL's accuracy counts a rating prediction right when it rounds to the
    label). The baseline a model must beat; HPFL's ``--accuracy_threshold=none`` takes it as p.

    Example:

    >>> from fedpersonal.data import synthetic_user_modeling
    >>> data = synthetic_user_modeling.generate_user_modeling(num_clients=2, users_per_client=5, seed=0)
    >>> 0.5 <= majority_class_accuracy(data) <= 1.0
    True
    """
    labels = np.concatenate([s.label[s.split == SPLIT_TRAIN] for s in data.silos]).astype(np.float64)
    if data.task != 'binary':
        labels = np.round(labels)
    _, counts = np.unique(labels, return_counts=True)
    return float(counts.max() / counts.sum())


def _distribution(prefix: str, values: np.ndarray) -> dict[str, Any]:
    return {
        f'{prefix}_min': int(values.min()),
        f'{prefix}_median': float(np.median(values)),
        f'{prefix}_max': int(values.max()),
    }


def attribute_distribution(data: UserModelingData) -> np.ndarray:
    """Fraction of each client's records that touch each attribute (the paper's "distribution of attributes").

    Entry ``[c, k]`` is the number of records of client ``c`` whose item has attribute ``k``, divided by the client's
    number of records. A row sums to the client's mean number of attributes per record (not to 1); a zero entry is a
    missing attribute of that client. Near-identical rows mean an IID partition in attributes.

    Args:
        data: A valid dataset.

    Returns:
        float64 ``[num_clients, K]``, rows in the order of ``data.silos``.
    """
    out = np.zeros((len(data.silos), data.num_attributes), dtype=np.float64)
    for c, silo in enumerate(data.silos):
        per_item = np.bincount(silo.item, minlength=silo.num_items).astype(np.float64)
        out[c] = per_item @ silo.item_attributes.astype(np.float64) / silo.item.size
    return out


def statistics(data: UserModelingData) -> dict[str, Any]:
    """Statistics of the paper's table plus per-client distributions (python scalars).

    Keys:

    * the paper's table: ``num_clients``, ``num_records``, ``num_users`` (distinct global user ids),
      ``num_items`` (distinct global item ids), ``num_attributes`` (``K``), ``attributes_per_item`` (mean number of
      attributes of the distinct items), ``attributes_per_record`` (mean over all records);
    * ``num_attributes_present``: attributes held by at least one item;
    * ``records_per_client_{min,median,max}``, ``users_per_client_*``, ``items_per_client_*``;
    * ``missing_attributes_per_client_{min,median,max}``: attributes no item of the client has;
    * ``records_train``, ``records_validation``, ``records_test``;
    * ``label_mean``: mean label (the correct rate of the binary task, the mean rating otherwise);
    * ``attribute_tv_distance_mean``: mean over clients of the total-variation distance between the client's
      attribute distribution (a row of `attribute_distribution`, normalized to sum to 1) and the pooled one of all
      records: 0 for identical mixes (IID), up to 1 for disjoint ones.

    Args:
        data: A valid dataset.

    Returns:
        The statistics.
    """
    silos = data.silos
    records = np.array([s.item.size for s in silos])
    users = np.array([s.num_users for s in silos])
    items = np.array([s.num_items for s in silos])
    item_ids = np.concatenate([s.global_item_ids for s in silos])
    item_attr_counts = np.concatenate([s.item_attributes.sum(axis=1) for s in silos])
    _, first = np.unique(item_ids, return_index=True)
    present = np.zeros(data.num_attributes, dtype=bool)
    for s in silos:
        present |= s.item_attributes.any(axis=0)
    distribution = attribute_distribution(data)
    counts = distribution * records[:, None]
    per_record = counts.sum(axis=1)
    pooled = counts.sum(axis=0) / counts.sum()
    normalized = counts / per_record[:, None]
    tv = 0.5 * np.abs(normalized - pooled[None, :]).sum(axis=1)
    splits = np.concatenate([s.split for s in silos])
    stats: dict[str, Any] = {
        'num_clients': len(silos),
        'num_records': int(records.sum()),
        'num_users': int(np.unique(np.concatenate([s.global_user_ids for s in silos])).size),
        'num_items': int(first.size),
        'num_attributes': int(data.num_attributes),
        'attributes_per_item': float(item_attr_counts[first].mean()),
        'attributes_per_record': float(per_record.sum() / records.sum()),
        'num_attributes_present': int(present.sum()),
    }
    stats.update(_distribution('records_per_client', records))
    stats.update(_distribution('users_per_client', users))
    stats.update(_distribution('items_per_client', items))
    stats.update(_distribution('missing_attributes_per_client', (distribution == 0).sum(axis=1)))
    stats['records_train'] = int(np.sum(splits == SPLIT_TRAIN))
    stats['records_validation'] = int(np.sum(splits == SPLIT_VALIDATION))
    stats['records_test'] = int(np.sum(splits == SPLIT_TEST))
    stats['label_mean'] = float(np.concatenate([s.label for s in silos]).astype(np.float64).mean())
    stats['attribute_tv_distance_mean'] = float(tv.mean())
    return stats


def plot_attribute_distribution(data: UserModelingData, path: str, *, title: str | None = None) -> str:
    """Saves `attribute_distribution` as a PNG heatmap (clients x attributes) with matplotlib's Agg backend.

    Colours follow a square-root scale so small fractions stay visible; missing attributes (fraction 0) are grey.
    Attribute names label the x axis when there are at most 40 attributes; otherwise the axis shows attribute
    indices (the order of ``data.attribute_names``). Client ids label the y axis (every n-th one for many clients).

    Args:
        data: A valid dataset.
        path: Output PNG path (its directory is created if needed).
        title: Figure title; default names the dataset.

    Returns:
        `path`.
    """
    import matplotlib  # Imported lazily: only plotting needs it.
    from matplotlib.figure import Figure  # Not pyplot: plotting to a file leaves the process's backend alone.

    matrix = attribute_distribution(data)
    num_clients, k = matrix.shape
    names_on_axis = k <= 40
    width = min(22.0, max(7.0, 0.28 * k + 3.0))
    height = min(16.0, max(3.5, 0.24 * num_clients + (2.8 if names_on_axis else 1.8)))
    fig = Figure(figsize=(width, height), dpi=110)
    ax = fig.subplots()
    cmap = matplotlib.colormaps['viridis'].copy()
    cmap.set_bad('#d9d9d9')  # Missing attributes (no item of the client has them) in light grey.
    norm = matplotlib.colors.PowerNorm(gamma=0.5, vmin=0.0, vmax=max(float(matrix.max()), 1e-12))
    image = ax.imshow(np.ma.masked_equal(matrix, 0.0), aspect='auto', cmap=cmap, norm=norm, interpolation='nearest')
    if names_on_axis:
        ax.set_xticks(np.arange(k))
        ax.set_xticklabels(data.attribute_names, rotation=60, ha='right', fontsize=8)
        ax.set_xlabel('attribute')
    else:
        step = max(1, int(np.ceil(k / 25)))
        ax.set_xticks(np.arange(0, k, step))
        ax.set_xticklabels([str(i) for i in range(0, k, step)], fontsize=8)
        ax.set_xlabel('attribute index (order of attribute_names)')
    step = max(1, int(np.ceil(num_clients / 40)))
    ax.set_yticks(np.arange(0, num_clients, step))
    ax.set_yticklabels([data.silos[c].client_id for c in range(0, num_clients, step)], fontsize=8)
    ax.set_ylabel('client')
    tv = statistics(data)['attribute_tv_distance_mean']
    ax.set_title(
        title
        or f'Distribution of attributes: {data.name} ({num_clients} clients, mean TV distance to pooled = {tv:.2f})',
        fontsize=10,
    )
    colorbar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    colorbar.set_label("fraction of the client's records with the attribute (sqrt scale; grey: missing)", fontsize=8)
    fig.tight_layout()
    directory = os.path.dirname(os.fspath(path))
    if directory:
        os.makedirs(directory, exist_ok=True)
    fig.savefig(path, format='png')
    return path
