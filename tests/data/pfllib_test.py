"""PFLlib's benchmark partitions: equal to PFLlib's own code, and to the partition PFLlib ships for MNIST."""

import hashlib
import os

import numpy as np
import pytest
from hypothesis import event
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedpersonal import errors
from fedpersonal.data import image_datasets
from fedpersonal.data import pfllib
from tests.data.pfllib_reference import run_pfllib

MNIST_DIR = os.path.join(os.path.dirname(__file__), '..', '..', '..', 'shared', 'data', 'mnist')

# PFLlib's dataset/MNIST/config.json (commit 927425b, `generate_MNIST.py noniid - dir`): each client's
# (label, count) pairs.
PFLLIB_MNIST_DIR_STATISTIC = [
    [[0, 140], [1, 890], [4, 1], [5, 319], [7, 29], [8, 1067], [9, 184]],
    [[0, 5], [2, 27], [5, 19], [6, 335], [8, 6], [9, 107]],
    [[0, 3], [3, 143], [6, 1461], [9, 23]],
    [[0, 155], [4, 1], [7, 2381], [8, 4]],
    [[0, 71], [1, 13], [3, 207], [5, 1129], [6, 6], [8, 40], [9, 451]],
    [[1, 38], [3, 1], [4, 39], [8, 25], [9, 6086]],
    [[1, 873], [2, 176], [3, 46], [6, 42], [8, 13], [9, 106]],
    [[1, 21], [2, 5], [3, 11], [5, 787], [7, 4], [8, 441]],
    [[0, 1], [1, 3599]],
    [[0, 633], [1, 1997], [2, 89], [4, 519], [6, 768]],
    [[0, 920], [1, 2], [2, 1450], [3, 513], [4, 134], [5, 97]],
    [[2, 159], [3, 3055], [5, 558]],
    [[0, 8], [1, 180], [2, 3277], [5, 148]],
    [[1, 237], [2, 343], [4, 6], [5, 453], [7, 1095]],
    [[5, 2719], [7, 3011]],
    [[0, 31], [3, 1785], [5, 16], [6, 4], [7, 756], [8, 2856]],
    [[0, 3628]],
    [[1, 26], [2, 1463], [3, 1379], [4, 335], [5, 60], [7, 17], [8, 2373]],
    [[0, 998], [5, 8], [6, 4260]],
    [[0, 310], [1, 1], [2, 1], [3, 1], [4, 5789], [9, 1]],
]
# The labels PFLlib saved for clients 0, 1 and 5 (dataset/MNIST/{train,test}/<client>.npz, in saved order):
# (count, first 16 hex digits of the sha256 of the int64 labels).
PFLLIB_MNIST_SAVED_LABELS = {
    (0, 'train'): (1972, 'd1af2ddd8bc67c7c'),
    (0, 'test'): (658, 'b5326ec9bc47ef57'),
    (1, 'train'): (374, 'bf06b455e03834c1'),
    (1, 'test'): (125, 'dc21c5a30acbbf61'),
    (5, 'train'): (4641, 'c735028402dfeb3f'),
    (5, 'test'): (1548, '57a31ce0f0ac0231'),
}


@pytest.mark.skipif(not os.path.isdir(MNIST_DIR), reason='MNIST copy not found at ../shared/data/mnist')
def test_reproduces_the_partition_pfllib_ships_for_mnist():
    data = image_datasets.load_idx_dataset(MNIST_DIR)
    labels = np.concatenate([data.train_labels, data.test_labels])
    parts = pfllib.partition_like_pfllib(labels, 'dirichlet')
    expected = np.zeros([20, 10], np.int64)
    for client, pairs in enumerate(PFLLIB_MNIST_DIR_STATISTIC):
        for label, count in pairs:
            expected[client, label] = count
    np.testing.assert_array_equal(parts.label_counts, expected)
    for (client, split), (count, digest) in PFLLIB_MNIST_SAVED_LABELS.items():
        saved = labels[getattr(parts, split)[client]].astype(np.int64)
        assert (saved.size, hashlib.sha256(saved.tobytes()).hexdigest()[:16]) == (count, digest)
    # The Generator stream: the same algorithm, another partition.
    other = pfllib.partition_like_pfllib(labels, 'dirichlet', legacy=False)
    assert not np.array_equal(other.label_counts, expected) and other.label_counts.sum() == labels.size


@settings(max_examples=15, deadline=None)
@given(
    per_class=st.lists(st.integers(60, 150), min_size=10, max_size=10),
    setting=st.sampled_from(pfllib.SETTINGS),
    num_clients=st.sampled_from([3, 5, 10, 20]),
    seed=st.integers(0, 2**31 - 1),
)
def test_partition_and_split_equal_pfllibs_code(per_class, setting, num_clients, seed):
    labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(10), per_class))
    try:
        ours = pfllib.partition_like_pfllib(labels, setting, num_clients=num_clients, seed=seed)
    except errors.InputError:
        event('refused')
        return  # Configurations PFLlib drops rows in or crashes on (tests/data/partition_test.py).
    event('compared')
    name, per_client = {'pathological': ('pat', 2), 'dirichlet': ('dir', None), 'iid': ('pat', 10)}[setting]
    rows, train, test = run_pfllib(
        labels, seed, split=True, num_clients=num_clients, num_classes=10, balance=False, partition_name=name,
        class_per_client=per_client, alpha=0.1, least_samples=pfllib.least_samples(labels.size, num_clients),
    )  # fmt: skip
    for c in range(num_clients):
        np.testing.assert_array_equal(ours.train[c], train[c])
        np.testing.assert_array_equal(ours.test[c], test[c])
        assert ours.label_counts[c].sum() == rows[c].size


def _tiny_dataset(n_train=300, n_test=100):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, [n_train + n_test, 28, 28, 1]).astype(np.float32) / 255.0
    labels = (np.arange(n_train + n_test) % 10).astype(np.int32)
    return image_datasets.ImageDataset('tiny', images[:n_train], labels[:n_train], images[n_train:], labels[n_train:])


def test_federate_tables_and_client_data():
    data = pfllib.federate(_tiny_dataset(), 'pathological', num_clients=5, balance=True)
    assert data.x.min() >= -1.0 and data.x.max() <= 1.0 and data.x.dtype == np.float32
    stats = data.statistics()
    assert stats['classes_per_client_max'] == 2 and stats['train_examples'] + stats['test_examples'] == 400
    train = data.client_data('train')
    assert train.client_ids == ['0', '1', '2', '3', '4']
    for c in ('0', '3'):
        got = list(train.create_tf_dataset_for_client(c).as_numpy_iterator())
        rows = data.partition.train[int(c)]
        np.testing.assert_array_equal(np.stack([e['x'] for e in got]), data.x[rows])
        np.testing.assert_array_equal([e['y'] for e in got], data.y[rows])
    assert sum(len(list(data.client_data('test').create_tf_dataset_for_client(c))) for c in data.client_ids) == 100
    with pytest.raises(errors.ConfigError, match="split must be 'train' or 'test'"):
        data.client_data('validation')
    with pytest.raises(errors.ConfigError, match='setting must be one of'):
        pfllib.federate(_tiny_dataset(), 'pat')


@pytest.mark.skipif(
    not os.path.isdir(image_datasets.FASHION_MNIST_DIR),
    reason='Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)',
)
def test_fashion_mnist_benchmark_partitions():
    source = image_datasets.load_idx_dataset(image_datasets.FASHION_MNIST_DIR, 'fashion_mnist')
    labels = np.concatenate([source.train_labels, source.test_labels])
    pathological = pfllib.partition_like_pfllib(labels, 'pathological')
    assert ((pathological.label_counts > 0).sum(axis=1) == 2).all()
    dirichlet = pfllib.partition_like_pfllib(labels, 'dirichlet')
    assert dirichlet.label_counts.sum(axis=1).min() >= 40
    for parts in (pathological, dirichlet):
        everyone = np.concatenate(parts.train + parts.test)
        assert np.array_equal(np.sort(everyone), np.arange(70000))
