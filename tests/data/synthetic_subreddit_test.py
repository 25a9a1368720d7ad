"""Tests for fedpersonal.data.synthetic_subreddit."""

import time

import numpy as np
import pytest

from fedpersonal.data import furl_tasks
from fedpersonal.data import synthetic_subreddit


@pytest.fixture(scope='module')
def default_data():
    start = time.perf_counter()
    data = synthetic_subreddit.generate_subreddit_like()
    return data, time.perf_counter() - start


def test_defaults_shape_and_speed(default_data):
    data, seconds = default_data
    assert seconds < 2.0
    assert (data.num_users, data.num_classes, data.max_chars, data.num_features, data.num_items) == (400, 20, 64, 0, 0)
    per_user = sum(data.examples_per_user(s) for s in furl_tasks.SPLITS)
    assert per_user.min() >= 40 and per_user.max() <= 120
    for split in furl_tasks.SPLITS:
        arrays = data.arrays(split)
        assert arrays['label'].min() >= 0 and arrays['label'].max() < 20
        assert arrays['chars'].shape[1] == 64 and arrays['chars'].max() < data.char_vocab_size
        assert arrays['features'].shape == (arrays['label'].size, 0)
    assert set(data.char_vocab) == set('abcdefghijklmnopqrstuvwxyz ')
    assert data.train.client_ids == data.eval.client_ids == [str(u) for u in range(400)]


def test_deterministic():
    kwargs = dict(num_users=30, num_subreddits=6, comments_per_user=(10, 20), vocab_words=100)
    a = synthetic_subreddit.generate_subreddit_like(seed=5, **kwargs)
    b = synthetic_subreddit.generate_subreddit_like(seed=5, **kwargs)
    c = synthetic_subreddit.generate_subreddit_like(seed=6, **kwargs)
    for split in furl_tasks.SPLITS:
        for key, value in a.arrays(split).items():
            np.testing.assert_array_equal(value, b.arrays(split)[key])
    assert not np.array_equal(a.arrays('train')['chars'][:50], c.arrays('train')['chars'][:50])
    assert a.num_classes == 6


def _naive_bayes_accuracy(num_subreddits=20, seed=0):
    """Test accuracy of a word naive-Bayes reader: text only, and text + the user's train label counts as prior."""
    user, texts, label, _ = synthetic_subreddit.generate_subreddit_corpus(num_subreddits=num_subreddits, seed=seed)
    counts = np.bincount(user)
    n_train, n_eval, _ = furl_tasks.split_sizes(counts)
    position = np.arange(user.size) - np.repeat(np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    train = position < np.repeat(n_train, counts)
    test = position >= np.repeat(n_train + n_eval, counts)
    vocab = {w: i for i, w in enumerate(sorted({w for t in texts for w in t.split()}))}
    tokens = [[vocab[w] for w in t.split()] for t in texts]
    word_counts = np.ones((num_subreddits, len(vocab)))
    for i in np.flatnonzero(train):
        np.add.at(word_counts[label[i]], tokens[i], 1)
    log_word = np.log(word_counts / word_counts.sum(axis=1, keepdims=True))
    global_prior = np.log(np.bincount(label[train], minlength=num_subreddits) + 1.0)
    user_counts = np.full((counts.size, num_subreddits), 0.1)
    np.add.at(user_counts, (user[train], label[train]), 1)
    user_prior = np.log(user_counts / user_counts.sum(axis=1, keepdims=True))
    test_rows = np.flatnonzero(test)
    text_score = np.stack([log_word[:, tokens[i]].sum(axis=1) for i in test_rows])
    text_only = np.mean(np.argmax(text_score + global_prior, axis=1) == label[test_rows])
    with_user = np.mean(np.argmax(text_score + user_prior[user[test_rows]], axis=1) == label[test_rows])
    user_only = np.mean(np.argmax(user_prior[user[test_rows]], axis=1) == label[test_rows])
    global_majority = np.mean(label[test_rows] == np.argmax(np.bincount(label[train])))
    return text_only, with_user, user_only, global_majority


def test_user_identity_carries_information_beyond_text():
    text_only, with_user, user_only, global_majority = _naive_bayes_accuracy()
    # Knowing the user alone (their majority train subreddit) beats the global majority class by far.
    assert user_only > 4 * global_majority and global_majority < 0.15
    # Text alone is informative but only moderately; the user adds a lot on top of it.
    assert 0.35 < text_only < 0.75
    assert with_user > text_only + 0.15


def test_user_positive_rate_is_majority_share(default_data):
    data, _ = default_data
    train = data.arrays('train')
    user0 = train['label'][train['user_id'] == 0]
    assert data.user_positive_rate[0] == np.bincount(user0).max() / user0.size  # A count's float64 quotient.
    assert data.user_positive_rate.mean() > 0.3


def test_bad_arguments():
    with pytest.raises(ValueError, match='comments_per_user'):
        synthetic_subreddit.generate_subreddit_like(comments_per_user=(2, 5))
    with pytest.raises(ValueError, match='num_subreddits'):
        synthetic_subreddit.generate_subreddit_like(num_subreddits=1)
