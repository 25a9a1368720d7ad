"""Client data and client states of HPFL: checks, datasets per split, initial states and their TFF types, and a
silo cut to the table rows it uses (`shrink`, `restore`)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms.hpfl.types import SPLITS
from fedpersonal.algorithms.hpfl.types import ClientData
from fedpersonal.algorithms.hpfl.types import ClientState
from fedpersonal.algorithms.hpfl.types import HpflDataError
from fedpersonal.models import gum


def batch_type() -> collections.OrderedDict:
    """TFF type of one batch of a client dataset."""
    return collections.OrderedDict(
        user=tff.TensorType(np.int64, [None]),
        item=tff.TensorType(np.int64, [None]),
        label=tff.TensorType(np.float32, [None]),
    )


def client_data_type(config: gum.GumConfig) -> tff.Type:
    """TFF type of a `ClientData`."""
    sequence = tff.SequenceType(batch_type())
    return tff.to_type(
        ClientData(
            train=sequence,
            validation=sequence,
            item_attributes=tff.TensorType(np.float32, [config.max_items, config.num_attributes]),
            seed=tff.TensorType(np.int64),
        )
    )


def check_silo(silo: Any, config: gum.GumConfig, name: str) -> None:
    """Raises `HpflDataError` naming the data set, the client and the field if `silo` cannot feed the GUM."""
    where = f'{name}: client {silo.client_id!r}'

    def fail(field: str, problem: str):
        raise HpflDataError(f'{where}: {field} {problem}')

    if silo.num_users > config.max_users:
        fail('num_users', f"= {silo.num_users} exceeds the model's max_users = {config.max_users}")
    if silo.num_items > config.max_items:
        fail('num_items', f"= {silo.num_items} exceeds the model's max_items = {config.max_items}")
    arrays = {f: np.asarray(getattr(silo, f)) for f in ('user', 'item', 'label', 'split')}
    n = arrays['user'].shape[0] if arrays['user'].ndim == 1 else -1
    for field, array in arrays.items():
        if array.ndim != 1 or array.shape[0] != n:
            fail(field, f'must be 1-D with one entry per record like user ({n}), got shape {array.shape}')
    for field, count in (('user', silo.num_users), ('item', silo.num_items)):
        array = arrays[field]
        if n and (not np.issubdtype(array.dtype, np.integer) or array.min() < 0 or array.max() >= count):
            fail(
                field,
                f'indices must be integers in [0, {count}), got range '
                f'[{array.min()}, {array.max()}] (dtype {array.dtype})',
            )
    if n and not np.isin(arrays['split'], (0, 1, 2)).all():
        bad = arrays['split'][~np.isin(arrays['split'], (0, 1, 2))][0]
        fail('split', f'values must be 0 (train), 1 (validation) or 2 (test), got {bad}')
    label = arrays['label'].astype(np.float64)
    lo, hi = config.rating_range
    if n and (not np.isfinite(label).all() or label.min() < lo or label.max() > hi):
        fail('label', f'must be finite and within the rating range [{lo}, {hi}], got [{label.min()}, {label.max()}]')
    if config.task == 'binary' and n and not np.isin(label, (0.0, 1.0)).all():
        fail('label', 'must be 0 or 1 for the binary task')
    attributes = np.asarray(silo.item_attributes)
    if attributes.shape != (silo.num_items, config.num_attributes):
        fail(
            'item_attributes',
            f'must have shape [num_items, K] = [{silo.num_items}, {config.num_attributes}], got {attributes.shape}',
        )
    if not np.isfinite(attributes).all() or (attributes < 0).any():
        fail('item_attributes', 'must be finite and non-negative (multi-hot)')


def padded_attributes(silo: Any, config: gum.GumConfig) -> np.ndarray:
    """The silo's item attribute rows padded with zero rows to ``[max_items, K]``."""
    attributes = np.zeros([config.max_items, config.num_attributes], np.float32)
    attributes[: silo.num_items] = np.asarray(silo.item_attributes, np.float32)
    return attributes


def split_dataset(
    silo: Any, config: gum.GumConfig, split: str, *, batch_size: int = 64, shuffle_seed: int | None = None
) -> tf.data.Dataset:
    """The records of one split of a silo as a dataset of `batch_type` batches (labels mapped to [0, 1]).

    Args:
      silo: A `fedpersonal.data.user_modeling.ClientSilo`.
      config: The model config (for the rating range).
      split: 'train', 'validation' or 'test'.
      batch_size: Batch size.
      shuffle_seed: If given, the records are shuffled (reshuffled at every epoch of a round, the same way every
        round); otherwise they stay in record order.
    """
    if split not in SPLITS:
        raise ValueError(f'split must be one of {tuple(SPLITS)}, got {split!r}.')
    if batch_size < 1:
        raise ValueError(f'batch_size must be >= 1, got {batch_size}.')
    keep = np.asarray(silo.split) == SPLITS[split]
    records = collections.OrderedDict(
        user=np.asarray(silo.user, np.int64)[keep],
        item=np.asarray(silo.item, np.int64)[keep],
        label=gum.to_unit(np.asarray(silo.label, np.float32)[keep], config.rating_range).astype(np.float32),
    )
    dataset = tf.data.Dataset.from_tensor_slices(records)
    if shuffle_seed is not None and keep.any():
        dataset = dataset.shuffle(int(keep.sum()), seed=shuffle_seed, reshuffle_each_iteration=True)
    return dataset.batch(batch_size)


def client_data(
    silo: Any,
    config: gum.GumConfig,
    *,
    batch_size: int = 64,
    seed: int = 0,
    shuffle: bool = True,
    data_name: str = 'data',
) -> ClientData:
    """A silo's `ClientData` (checked: bad input raises `HpflDataError` naming the client and the field).

    Args:
      silo: A `fedpersonal.data.user_modeling.ClientSilo`.
      config: The model config.
      batch_size: Batch size of both datasets.
      seed: The silo's seed (train shuffling and `ClientData.seed`).
      shuffle: Shuffle the train split (validation stays in record order).
      data_name: The data set's name, for error messages.
    """
    check_silo(silo, config, data_name)
    return ClientData(
        train=split_dataset(silo, config, 'train', batch_size=batch_size, shuffle_seed=seed if shuffle else None),
        validation=split_dataset(silo, config, 'validation', batch_size=batch_size),
        item_attributes=padded_attributes(silo, config),
        seed=np.int64(seed),
    )


def federated_data(
    data: Any, config: gum.GumConfig, *, batch_size: int = 64, seed: int = 0, shuffle: bool = True
) -> list[ClientData]:
    """`client_data` of every silo of a `UserModelingData`, in silo order (silo i gets seed ``seed * 1000 + i``)."""
    return [
        client_data(silo, config, batch_size=batch_size, seed=seed * 1000 + i, shuffle=shuffle, data_name=data.name)
        for i, silo in enumerate(data.silos)
    ]


def initial_client_state(
    config: gum.GumConfig, num_users: int, num_items: int, *, public_seed: int = 0, private_seed: int = 0
) -> ClientState:
    """A client's first `ClientState`: `gum.initial_weights` (the public part is the same for every client with the
    same `public_seed`, and equals HPFL's initial global c^g) and the silo's real sizes."""
    if not 0 <= num_users <= config.max_users or not 0 <= num_items <= config.max_items:
        raise HpflDataError(
            f"silo sizes ({num_users} users, {num_items} items) exceed the model's tables "
            f'({config.max_users}, {config.max_items}).'
        )
    return ClientState(
        model=gum.initial_weights(config, public_seed, private_seed),
        num_users=np.int32(num_users),
        num_items=np.int32(num_items),
    )


def initial_client_states(
    data: Any, config: gum.GumConfig, *, public_seed: int = 0, seed: int = 0
) -> list[ClientState]:
    """`initial_client_state` of every silo (private tables seeded ``seed * 1000 + i``)."""
    return [
        initial_client_state(config, s.num_users, s.num_items, public_seed=public_seed, private_seed=seed * 1000 + i)
        for i, s in enumerate(data.silos)
    ]


def struct_type(fn) -> tff.Type:
    """The TFF type of what the no-argument TF function `fn` returns."""
    return tff.tensorflow.computation(fn).type_signature.result


def client_state_type(config: gum.GumConfig) -> tff.Type:
    """TFF type of a `ClientState`."""
    return struct_type(lambda: initial_client_state(config, 0, 0))


def shrink(data: ClientData, state: ClientState, rows: Callable[[Any, int], int]) -> tuple[ClientData, ClientState]:
    """The silo's data and state with its item tables cut to ``rows(num_items, max_items)`` rows (numpy).

    Exact: rows past a silo's users/items are never indexed by its data, so their gradients are 0 and every
    optimizer leaves them unchanged (Adam's state restarts every round), and they are masked out of the k-means
    and of the fine-grained update; `restore` puts them back. Saves the padded rows' dense optimizer and
    clustering work (the largest ASSIST silo has 10,745 items, the median a few hundred).
    """
    private = state.model.private
    users = np.shape(private.theta)[0]  # User tables are small: one cut per item-table size (fewer traces).
    items = rows(state.num_items, np.shape(private.difficulty)[0])
    cut_rows = {field: users if field == 'theta' else items for field in private._fields}
    cut_private = private._replace(**{f: np.asarray(getattr(private, f))[:n] for f, n in cut_rows.items()})
    return (
        data._replace(item_attributes=np.asarray(data.item_attributes)[:items]),
        state._replace(model=state.model._replace(private=cut_private)),
    )


def restore(full: ClientState, cut: ClientState) -> ClientState:
    """`cut` (a state from `shrink`, trained) with `full`'s rows past its cut put back."""
    full_private, private = full.model.private, cut.model.private
    restored = {
        f: np.concatenate([getattr(private, f), np.asarray(getattr(full_private, f))[len(getattr(private, f)) :]])
        for f in private._fields
    }
    return cut._replace(model=cut.model._replace(private=private._replace(**restored)))
