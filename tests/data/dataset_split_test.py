"""Support/query split: deterministic and disjoint even when the client dataset reshuffles."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal.data import dataset_split


def _client(n=23, seed=None, batch=5):
    data = collections.OrderedDict(
        x=np.arange(n, dtype=np.int64)[:, None], y=(np.arange(n) % 5).astype(np.float32)[:, None]
    )
    ds = tf.data.Dataset.from_tensor_slices(data)
    if seed is not None:
        ds = ds.shuffle(n, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch)


def _ids(dataset):
    return [int(v) for batch in dataset for v in batch['x'].numpy().ravel()]


def test_split_is_disjoint_covering_and_order_invariant():
    split_fn = algorithms.build_dataset_split_fn(algorithms.ReconstructionSplit())
    reference = None
    for seed in range(4):
        support, query = split_fn(_client(seed=seed))
        s, q = _ids(support), _ids(query)
        assert not set(s) & set(q)
        assert sorted(s + q) == list(range(23))
        assert len(s) == 12 and len(q) == 11
        reference = reference or (sorted(s), sorted(q))
        assert (sorted(s), sorted(q)) == reference  # Same examples whatever the order.


def test_hash_split_is_independent_between_clients():
    # 300 clients, each rating a random 40 of 100 items (rating = item % 5, so an item's example is the same in
    # every client). Unsalted, an example's rank depends on its content alone and the same items fall in the
    # support set of almost every client; salted per client, each item is in about half of its clients' support
    # sets (binomial, ~120 clients per item: share 0.5 +- 0.05).
    rng = np.random.default_rng(0)
    in_support, total = np.zeros(100), np.zeros(100)
    for _ in range(300):
        items = rng.choice(100, size=40, replace=False).astype(np.int64)
        examples = collections.OrderedDict(x=items[:, None], y=(items % 5).astype(np.float32)[:, None])
        support, _ = dataset_split.split_examples(examples, algorithms.ReconstructionSplit())
        in_support[support['x'].numpy().ravel()] += 1
        total[items] += 1
    share = in_support / total
    assert np.mean((share < 0.25) | (share > 0.75)) == 0.0, np.sort(share)
    assert abs(np.mean(share) - 0.5) < 0.02


def test_tff_even_odd_split_leaks_under_reshuffling():
    """The failure mode this split fixes: TFF 0.87's split iterates the dataset twice."""
    tff_split = tff.learning.models.ReconstructionModel.build_dataset_split_fn(split_dataset=True)
    leaked = False
    for seed in range(5):
        support, query = tff_split(_client(seed=seed))
        leaked |= bool(set(_ids(support)) & set(_ids(query)))
    assert leaked


def test_batches_keep_the_client_batch_size():
    support, query = algorithms.build_dataset_split_fn()(_client(n=23, batch=4))
    assert [int(b['x'].shape[0]) for b in support] == [4, 4, 4]
    assert [int(b['x'].shape[0]) for b in query] == [4, 4, 3]


def test_epochs_and_step_caps():
    split = algorithms.ReconstructionSplit(
        recon_epochs=5, recon_steps_max=7, post_recon_epochs=2, post_recon_steps_max=3
    )
    support, query = algorithms.build_dataset_split_fn(split)(_client())
    assert len(list(support)) == 7  # 3 batches x 5 epochs, capped at 7.
    assert len(list(query)) == 3


def test_overlap_uses_everything_for_both():
    support, query = algorithms.build_dataset_split_fn(algorithms.ReconstructionSplit(allow_overlap=True))(_client())
    assert sorted(_ids(support)) == sorted(_ids(query)) == list(range(23))


def test_order_strategy_takes_the_first_examples():
    split = algorithms.ReconstructionSplit(strategy='order', support_fraction=0.25)
    support, query = algorithms.build_dataset_split_fn(split)(_client(n=20))
    assert _ids(support) == list(range(5)) and _ids(query) == list(range(5, 20))


@pytest.mark.parametrize('n,expected', [(0, (0, 0)), (1, (1, 0)), (2, (1, 1)), (3, (2, 1))])
def test_tiny_clients(n, expected):
    support, query = algorithms.build_dataset_split_fn()(
        _client(n=max(n, 1)).take(1 if n else 0) if n == 0 else _client(n=n)
    )
    assert (len(_ids(support)), len(_ids(query))) == expected


def test_works_inside_tf_function_and_with_nested_elements():
    data = collections.OrderedDict(
        x=collections.OrderedDict(a=np.arange(10, dtype=np.int64)[:, None], b=np.ones([10, 2], np.float32)),
        y=np.arange(10, dtype=np.float32),
    )
    split_fn = algorithms.build_dataset_split_fn()

    @tf.function
    def total(ds):
        support, query = split_fn(ds)
        add = lambda acc, b: acc + tf.reduce_sum(b['x']['a'])
        return support.reduce(tf.constant(0, tf.int64), add), query.reduce(tf.constant(0, tf.int64), add)

    s, q = total(tf.data.Dataset.from_tensor_slices(data).batch(3))
    assert int(s) + int(q) == sum(range(10))


def test_invalid_config():
    with pytest.raises(ValueError, match='support_fraction'):
        algorithms.ReconstructionSplit(support_fraction=1.0)
    with pytest.raises(ValueError, match='strategy'):
        algorithms.ReconstructionSplit(strategy='random')


def test_fingerprints_ignore_order():
    a = dataset_split.example_fingerprints({'x': tf.constant([[1], [2], [3]])})
    b = dataset_split.example_fingerprints({'x': tf.constant([[3], [1], [2]])})
    assert sorted(a.numpy().tolist()) == sorted(b.numpy().tolist())
    assert len(set(a.numpy().tolist())) == 3
