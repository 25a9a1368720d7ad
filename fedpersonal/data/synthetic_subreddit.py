"""A synthetic Subreddit-like FURL task: predict the subreddit of a user's comment from its text.

The paper's Subreddit data (Reddit comments on the top 256 subreddits; Bui et al. 2019, Section 4.1) is not available
here, so `generate_subreddit_like` draws a corpus with the property that matters for FURL: the text alone predicts
the subreddit only moderately, and knowing *who* wrote the comment adds a lot, because each user comments mostly on a
few subreddits.

Generative model (all draws from ``np.random.default_rng(seed)``, so the result is a function of the arguments):

* **Words**: ``vocab_words`` distinct lowercase letter strings of 2..8 letters. The first ``vocab_words // 10`` are
  *generic* words (used everywhere, Zipfian); the rest are *content* words.
* **Subreddits come in topic pairs**: subreddits ``2t`` and ``2t + 1`` share topic ``t``, a Zipfian distribution
  (exponent 1.1) over a topic-specific random ranking of the content words. Subreddit ``s`` writes content words
  from ``(1 - own) * topic + own * own_s`` where ``own_s`` is a Zipfian distribution over its own ranking and
  ``own = 0.25``. So text identifies the topic well but separates the two subreddits of a pair only weakly.
* **Users** have a preference ``p_u ~ Dirichlet(alpha = 0.15)`` over subreddits (concentrated: one to three
  subreddits dominate a user) and write ``Uniform{comments_per_user}`` comments, each on a subreddit drawn from
  ``p_u`` -- which of a pair a user prefers is knowable from the user, not from the text.
* **Comments** have ``2 + Binomial(6, 0.4)`` words (2..8); each word is generic with probability 0.35, else a content
  word of the comment's subreddit. Texts are truncated to ``max_chars`` characters (the rare overflow loses its tail).

With the defaults (400 users, 20 subreddits, ~32K comments, all texts <= 64 chars): the global majority class
covers ~6% of comments and a user's own majority subreddit ~44% of the user's comments; on the test split a
naive-Bayes reader of the words gets ~57% accuracy from the text alone and ~82% with the user's train label counts as
its prior (measured for seed 0; tests/data/synthetic_subreddit_test.py checks the user effect).

Comments are generated in a random order per user, which is taken as their time order for the 0.8/0.1/0.1 split.
Examples have no side features (``features`` has shape ``[0]``) and no ``item_id``.
"""

from __future__ import annotations

import numpy as np

from fedpersonal import errors
from fedpersonal.data import furl_tasks

__all__ = ['generate_subreddit_like', 'generate_subreddit_corpus']

_LETTERS = np.array(list('abcdefghijklmnopqrstuvwxyz'))
_GENERIC_FRACTION = 0.1
_GENERIC_PROB = 0.35
_OWN_WEIGHT = 0.25
_ZIPF_EXPONENT = 1.1
_DIRICHLET_ALPHA = 0.15
_MAX_EXTRA_WORDS = 6
_EXTRA_WORD_PROB = 0.4


def _words(rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` distinct random lowercase words of 2..8 letters (deterministic given `rng`)."""
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        m = 2 * (n - len(out)) + 8
        lengths = rng.choice(np.arange(2, 9), size=m, p=[0.08, 0.16, 0.2, 0.2, 0.16, 0.12, 0.08])
        letters = rng.integers(0, 26, size=(m, 8))
        for length, row in zip(lengths, letters):
            word = ''.join(_LETTERS[row[:length]])
            if word not in seen:
                seen.add(word)
                out.append(word)
                if len(out) == n:
                    break
    return np.asarray(out, dtype=object)


def _zipf(rng: np.random.Generator, n: int) -> np.ndarray:
    """A Zipfian distribution over a random ranking of ``range(n)``."""
    weights = np.arange(1, n + 1, dtype=np.float64) ** -_ZIPF_EXPONENT
    p = np.empty(n)
    p[rng.permutation(n)] = weights / weights.sum()
    return p


def generate_subreddit_corpus(
    *,
    num_users: int = 400,
    num_subreddits: int = 20,
    comments_per_user: tuple[int, int] = (40, 120),
    vocab_words: int = 600,
    seed: int = 0,
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """Draws the raw corpus (see the module docstring).

    Returns:
        ``(user_id, texts, subreddit, preferences)``: int64 ``[N]`` user of each comment (users in order, each
        user's comments in generation order), the ``N`` comment texts, int64 ``[N]`` subreddit of each comment, and
        float64 ``[num_users, num_subreddits]`` user preferences.
    """
    if num_users < 1 or num_subreddits < 2:
        raise errors.ConfigError(f'need num_users >= 1 and num_subreddits >= 2, got {num_users}, {num_subreddits}')
    low, high = comments_per_user
    if not 3 <= low <= high:
        raise errors.ConfigError(
            f'comments_per_user must be (low, high) with 3 <= low <= high, got {comments_per_user}'
        )
    if vocab_words < 20:
        raise errors.ConfigError(f'vocab_words must be >= 20, got {vocab_words}')
    rng = np.random.default_rng(seed)
    words = _words(rng, vocab_words)
    num_generic = max(1, int(vocab_words * _GENERIC_FRACTION))
    num_content = vocab_words - num_generic
    generic = _zipf(rng, num_generic)
    num_topics = (num_subreddits + 1) // 2
    topics = np.stack([_zipf(rng, num_content) for _ in range(num_topics)])
    own = np.stack([_zipf(rng, num_content) for _ in range(num_subreddits)])
    content = (1 - _OWN_WEIGHT) * topics[np.arange(num_subreddits) // 2] + _OWN_WEIGHT * own
    # One distribution per subreddit over the whole vocabulary (generic words first).
    vocab_dist = np.concatenate(
        [np.tile(_GENERIC_PROB * generic, (num_subreddits, 1)), (1 - _GENERIC_PROB) * content], axis=1
    )
    cdf = np.cumsum(vocab_dist, axis=1)
    cdf[:, -1] = 1.0

    preferences = rng.dirichlet(np.full(num_subreddits, _DIRICHLET_ALPHA), size=num_users)
    counts = rng.integers(low, high + 1, size=num_users)
    user_id = np.repeat(np.arange(num_users, dtype=np.int64), counts)
    pref_cdf = np.cumsum(preferences, axis=1)
    pref_cdf[:, -1] = 1.0
    u = rng.random(user_id.size)
    subreddit = (u[:, None] >= pref_cdf[user_id]).sum(axis=1).astype(np.int64)

    n = user_id.size
    max_words = 2 + _MAX_EXTRA_WORDS
    lengths = 2 + rng.binomial(_MAX_EXTRA_WORDS, _EXTRA_WORD_PROB, size=n)
    draws = rng.random((n, max_words))
    word_ids = np.empty((n, max_words), dtype=np.int64)
    for s in range(num_subreddits):  # Inverse-CDF sampling, one subreddit at a time.
        rows = subreddit == s
        word_ids[rows] = np.searchsorted(cdf[s], draws[rows], side='right')
    word_ids = np.minimum(word_ids, vocab_words - 1)
    texts = [' '.join(words[ids[:length]]) for ids, length in zip(word_ids, lengths)]
    return user_id, texts, subreddit, preferences


def generate_subreddit_like(
    *,
    num_users: int = 400,
    num_subreddits: int = 20,
    comments_per_user: tuple[int, int] = (40, 120),
    vocab_words: int = 600,
    max_chars: int = 64,
    seed: int = 0,
) -> furl_tasks.FurlData:
    """Generates the synthetic Subreddit-like FURL task (multiclass: ``num_classes = num_subreddits``).

    Args:
        num_users: Number of users (clients).
        num_subreddits: Number of subreddits (classes); they form ``ceil(num_subreddits / 2)`` topic pairs.
        comments_per_user: Inclusive range of the number of comments per user (low >= 3).
        vocab_words: Size of the synthetic word list.
        max_chars: Comment length in characters.
        seed: Seed of every random draw.

    Returns:
        A `furl_tasks.FurlData` (no side features, no ``item_id``).
    """
    if max_chars < 1:
        raise errors.ConfigError(f'max_chars must be >= 1, got {max_chars}')
    user_id, texts, subreddit, _ = generate_subreddit_corpus(
        num_users=num_users,
        num_subreddits=num_subreddits,
        comments_per_user=comments_per_user,
        vocab_words=vocab_words,
        seed=seed,
    )
    n = user_id.size
    description = (
        f'Synthetic Subreddit-like corpus (seed {seed}): {num_users} users, {num_subreddits} subreddits in topic '
        f'pairs, {comments_per_user[0]}-{comments_per_user[1]} comments per user, {vocab_words} words; '
        f'label = subreddit; per-user 0.8/0.1/0.1 split in generation order.'
    )
    return furl_tasks.build_furl_data(
        name='synthetic_subreddit',
        description=description,
        user_id=user_id,
        order_key=np.arange(n),
        doc_index=np.arange(n),
        label=subreddit,
        doc_texts=texts,
        doc_features=np.zeros((n, 0), np.float32),
        num_classes=num_subreddits,
        max_chars=max_chars,
        user_ids=np.arange(num_users, dtype=np.int64),
    )
