"""Tests for fedpersonal.data.furl_tasks: characters, splits, FurlData and its ClientData."""

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal.data import furl_tasks


def test_char_vocab_and_encoding():
    vocab = furl_tasks.build_char_vocab(['Ab', 'ba c'])
    assert vocab == {' ': 2, 'a': 3, 'b': 4, 'c': 5}
    encoded = furl_tasks.encode_texts(['AB', 'cab xz', ''], vocab, max_chars=5)
    assert encoded.dtype == np.int32 and encoded.shape == (3, 5)
    np.testing.assert_array_equal(
        encoded,
        [
            [3, 4, 0, 0, 0],  # lowercased, right-padded with 0
            [5, 3, 4, 2, furl_tasks.OOV_ID],  # truncated to 5; 'x' unknown
            [0, 0, 0, 0, 0],
        ],
    )
    assert furl_tasks.encode_texts(['abc'], vocab, max_chars=0).shape == (1, 0)


def test_split_sizes_rule():
    n_train, n_eval, n_test = furl_tasks.split_sizes(np.array([3, 4, 10, 16, 20, 100, 737]))
    assert n_train.tolist() == [1, 2, 8, 12, 16, 80, 589]
    assert n_eval.tolist() == [1, 1, 1, 1, 2, 10, 73]
    assert n_test.tolist() == [1, 1, 1, 3, 2, 10, 75]
    with pytest.raises(ValueError, match='at least 3'):
        furl_tasks.split_sizes(np.array([5, 2]))


def _tiny(split_order='time', seed=0, with_items=False):
    # User 1 has 10 examples (time keys given in reverse file order), user 0 has 3; 4 documents.
    user_id = np.array([1] * 10 + [0] * 3)
    order_key = np.array(list(range(10, 0, -1)) + [5, 6, 7])
    doc_index = np.array([0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 3, 3, 2])
    label = np.array([1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0, 0])
    texts = ['Ab', 'b', 'ab', 'zq']  # 'z' and 'q' occur only in document 3
    features = np.arange(8, dtype=np.float32).reshape(4, 2)
    return furl_tasks.build_furl_data(
        name='tiny',
        description='tiny',
        user_id=user_id,
        order_key=order_key,
        doc_index=doc_index,
        label=label,
        doc_texts=texts,
        doc_features=features,
        num_classes=2,
        max_chars=3,
        user_ids=np.array([7, 9]),
        item_id=doc_index if with_items else None,
        num_items=4 if with_items else 0,
        split_order=split_order,
        seed=seed,
    )


def _client_arrays(client_data, client_id):
    rows = list(client_data.create_tf_dataset_for_client(client_id).as_numpy_iterator())
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def test_furl_data_time_split_and_client_data():
    data = _tiny()
    assert (data.num_users, data.num_classes, data.max_chars, data.num_features, data.num_items) == (2, 2, 3, 2, 0)
    assert data.client_ids == ['0', '1']
    for split in furl_tasks.SPLITS:
        assert data.client_data(split).client_ids == ['0', '1']  # same users in every split
    assert data.examples_per_user('train').tolist() == [1, 8]
    assert data.examples_per_user('eval').tolist() == [1, 1]
    assert data.examples_per_user('test').tolist() == [1, 1]
    # User 1's rows in time order are the file rows reversed: labels [0, 0, 1, 1, 1, 1, 0, 0, 1, 1].
    train1 = _client_arrays(data.train, '1')
    assert train1['label'].tolist() == [0, 0, 1, 1, 1, 1, 0, 0]
    assert _client_arrays(data.eval, '1')['label'].tolist() == [1]
    assert _client_arrays(data.test, '1')['user_id'].tolist() == [1]
    assert train1['user_id'].tolist() == [1] * 8
    assert list(train1) == list(furl_tasks.EXAMPLE_KEYS)
    # Vocabulary from the train documents of both users (docs 0..3 all occur in train).
    assert data.char_vocab_size == len(data.char_vocab) + 2
    # Row 0 of user 1's train split is file row 9 -> document 1 ('b').
    np.testing.assert_array_equal(train1['chars'][0], [data.char_vocab['b'], 0, 0])
    np.testing.assert_array_equal(train1['features'][0], [2.0, 3.0])
    spec = data.train.element_type_structure
    assert spec['chars'] == tf.TensorSpec([3], tf.int32) and spec['features'] == tf.TensorSpec([2], tf.float32)
    assert spec['user_id'] == tf.TensorSpec([], tf.int64) and spec['label'] == tf.TensorSpec([], tf.int64)
    # Per-user positive rate on train: user 0 has its first example (label 1), user 1 4/8.
    np.testing.assert_array_equal(data.user_positive_rate, [1.0, 0.5])  # Counts' quotients: exact.
    np.testing.assert_array_equal(data.user_ids, [7, 9])
    arrays = data.arrays('train')
    assert arrays['label'].shape == (9,) and arrays['chars'].shape == (9, 3)
    stats = data.statistics()
    assert stats['num_examples'] == 13 and stats['num_train_examples'] == 9
    assert stats['positive_rate'] == 7 / 13  # The integer labels' mean: one float64 division.
    with pytest.raises(ValueError, match='not a client'):
        data.train.create_tf_dataset_for_client('2')
    with pytest.raises(ValueError, match='split'):
        data.arrays('validation')


def test_vocabulary_comes_from_train_text_only():
    # One user, three examples: 1 train ('ab'), 1 eval ('a'), 1 test ('xa').
    user_id = np.array([0, 0, 0])
    data = furl_tasks.build_furl_data(
        name='t',
        description='',
        user_id=user_id,
        order_key=np.arange(3),
        doc_index=np.array([0, 1, 2]),
        label=np.array([0, 1, 2]),
        doc_texts=['ab', 'a', 'xa'],
        doc_features=np.zeros((3, 0)),
        num_classes=3,
        max_chars=2,
        user_ids=np.array([0]),
    )
    assert data.char_vocab == {'a': 2, 'b': 3}
    test_chars = _client_arrays(data.test, '0')['chars']
    np.testing.assert_array_equal(test_chars, [[furl_tasks.OOV_ID, 2]])  # 'x' was never seen in train text
    assert data.user_positive_rate.tolist() == [1.0]  # multiclass: share of the user's top train class
    assert data.train.element_type_structure['features'].shape == (0,)


def test_graph_path_matches_python_path():
    data = _tiny(with_items=True)

    @tf.function
    def collect(client_id):
        ds = data.train.serializable_dataset_fn(client_id)
        return ds.batch(100).get_single_element()

    for client_id in data.client_ids:
        graph = collect(tf.constant(client_id))
        python = _client_arrays(data.train, client_id)
        assert list(graph) == list(python) == list(furl_tasks.EXAMPLE_KEYS) + ['item_id']
        for key in python:
            np.testing.assert_array_equal(graph[key].numpy(), python[key])


def test_random_split_order_is_seeded():
    a, b = _tiny('random', seed=1), _tiny('random', seed=1)
    labels = lambda d: _client_arrays(d.train, '1')['label'].tolist() + _client_arrays(d.test, '1')['label'].tolist()
    assert labels(a) == labels(b)
    orders = {tuple(labels(_tiny('random', seed=s))) for s in range(6)}
    assert len(orders) > 1
    with pytest.raises(ValueError, match='split_order'):
        _tiny('shuffled')


def test_build_rejects_bad_inputs():
    kwargs = dict(
        name='t',
        description='',
        user_id=np.array([0, 0, 0]),
        order_key=np.arange(3),
        doc_index=np.array([0, 0, 0]),
        doc_texts=['a'],
        doc_features=np.zeros((1, 0)),
        max_chars=2,
        user_ids=np.array([0]),
    )
    with pytest.raises(ValueError, match='labels'):
        furl_tasks.build_furl_data(label=np.array([0, 1, 2]), num_classes=2, **kwargs)
    with pytest.raises(ValueError, match='at least 3'):
        furl_tasks.build_furl_data(
            **{**kwargs, 'user_id': np.array([0, 0, 1]), 'user_ids': np.array([0, 1])},
            label=np.array([0, 1, 0]),
            num_classes=2,
        )
