"""Token ids for next-word prediction: the id layout, OOV hashing, BOS/EOS, truncation and errors."""

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal.data import text_pipeline as tp


def test_layout_puts_bos_eos_in_the_global_range_and_only_buckets_in_the_local_range():
    layout = tp.TokenLayout(vocab_size=10, num_oov_buckets=3)
    assert (layout.pad, layout.bos, layout.eos, layout.oov_start) == (0, 11, 12, 13)
    assert layout.num_global_ids == 13 and layout.num_classes == 16
    assert list(layout.oov_ids()) == [13, 14, 15]
    assert layout.bos < layout.num_global_ids and layout.eos < layout.num_global_ids


def test_encode_known_words_bos_eos_and_padding():
    encoder = tp.TokenIdEncoder(['the', 'cat', 'sat'], num_oov_buckets=2, max_sequence_length=5)
    ids = encoder.ids(['the cat sat', 'sat'])
    bos, eos = encoder.layout.bos, encoder.layout.eos
    np.testing.assert_array_equal(ids, [[bos, 1, 2, 3, eos, 0], [bos, 3, eos, 0, 0, 0]])
    encoded = encoder.encode(['the cat sat'])
    np.testing.assert_array_equal(encoded['x'], [[bos, 1, 2, 3, eos]])
    np.testing.assert_array_equal(encoded['y'], [[1, 2, 3, eos, 0]])


def test_long_examples_are_truncated_without_eos():
    encoder = tp.TokenIdEncoder(['a'], num_oov_buckets=1, max_sequence_length=3)
    ids = encoder.ids(['a a a a a'])
    np.testing.assert_array_equal(ids, [[encoder.layout.bos, 1, 1, 1]])


def test_oov_words_hash_like_static_vocabulary_table_into_the_local_range():
    vocab = ['w0', 'w1', 'w2']
    encoder = tp.TokenIdEncoder(vocab, num_oov_buckets=7, max_sequence_length=8)
    words = ['zebra', 'quokka', 'w1', 'zebra', 'axolotl']
    ids = encoder.ids([' '.join(words)])[0, 1:6]
    table = tf.lookup.StaticVocabularyTable(
        tf.lookup.KeyValueTensorInitializer(vocab, tf.range(3, dtype=tf.int64)), num_oov_buckets=7
    )
    raw = table.lookup(tf.constant(words)).numpy()
    expected = np.where(raw < 3, raw + 1, raw - 3 + encoder.layout.oov_start)
    np.testing.assert_array_equal(ids, expected)
    assert ids[0] == ids[3] and all(i >= encoder.layout.oov_start for i in ids[[0, 1, 3, 4]])


def test_encode_clients_keeps_time_order_and_limits_examples():
    encoder = tp.TokenIdEncoder(['a', 'b', 'c'], num_oov_buckets=1, max_sequence_length=2)
    encoded = tp.encode_clients({'u1': ['a', 'b', 'c']}, encoder, max_examples_per_client=2)
    np.testing.assert_array_equal(encoded['u1']['y'][:, 0], [1, 2])
    data = tp.to_client_data(encoded)
    element = next(iter(data.create_tf_dataset_for_client('u1')))
    np.testing.assert_array_equal(element['x'].numpy(), [encoder.layout.bos, 1])


def test_token_statistics():
    encoder = tp.TokenIdEncoder(['a'], num_oov_buckets=2, max_sequence_length=4)
    stats = tp.token_statistics(tp.encode_clients({'u': ['a zz', 'yy']}, encoder), encoder.layout)
    # Targets: a, zz, EOS | yy, EOS  -> 5 targets, 2 OOV, 2 EOS.
    assert stats == {'target_tokens': 5, 'oov_fraction': 0.4, 'eos_fraction': 0.4}


@pytest.mark.parametrize('vocab, message', [([], 'empty'), (['a', 'a'], 'duplicate')])
def test_bad_vocabularies(vocab, message):
    with pytest.raises(tp.TextPipelineError, match=message):
        tp.TokenIdEncoder(vocab, num_oov_buckets=1)


def test_bad_clients_are_named():
    encoder = tp.TokenIdEncoder(['a'], num_oov_buckets=1)
    with pytest.raises(tp.TextPipelineError, match="'alice' has no examples"):
        tp.encode_clients({'alice': []}, encoder)
    with pytest.raises(tp.TextPipelineError, match="'bob' has a non-string"):
        tp.encode_clients({'bob': ['a', 3]}, encoder)
    with pytest.raises(tp.TextPipelineError, match='num_oov_buckets'):
        tp.TokenLayout(5, 0)
