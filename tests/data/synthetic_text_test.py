"""Tests for fedpersonal.data.synthetic_text (generated next-word-prediction corpus with personal words)."""

import collections
import math

import numpy as np
import pytest

from fedpersonal.data import synthetic_text
from fedpersonal.data import text_corpus


@pytest.fixture(scope='module')
def corpus():
    return synthetic_text.generate_text_corpus()


def _all(corpus):
    return {**corpus.train, **corpus.test}


def test_deterministic_by_seed(corpus):
    assert synthetic_text.generate_text_corpus() == corpus
    other = synthetic_text.generate_text_corpus(seed=1)
    assert other.train != corpus.train
    assert 'seed=0' in corpus.source and 'common_vocab_size=3000' in corpus.source


def test_shapes(corpus):
    clients = _all(corpus)
    assert corpus.name == 'synthetic_text'
    assert (len(corpus.train), len(corpus.test)) == (160, 40) and len(clients) == 200
    assert sorted(clients) == [f'user_{i:04d}' for i in range(200)]
    sizes = np.array([len(examples) for examples in clients.values()])
    assert sizes.min() >= 20 and sizes.max() <= 120
    # Heavy-tailed: most clients are small, a few are large.
    assert np.median(sizes) < 50 and sizes.max() >= 100 and np.mean(sizes) > np.median(sizes)
    lengths = [len(e.split()) for examples in clients.values() for e in examples]
    assert min(lengths) >= 5 and max(lengths) <= 30 and 9 <= np.median(lengths) <= 16
    for examples in clients.values():
        for example in examples:
            tokens = example.split()
            assert tokens[-1] in ('.', '?', '!') and tokens[-2] not in (',', '.', '?', '!')
            assert example == ' '.join(tokens) and example == example.lower()
            assert all(t not in ('.', '?', '!') for t in tokens[:-1])  # One sentence per example.


def test_personal_words_are_concentrated_and_mostly_out_of_a_small_vocabulary(corpus):
    again, personal = synthetic_text.generate_text_corpus_with_personal_words()
    assert again == corpus and sorted(personal) == sorted(_all(corpus))
    assert all(len(words) == 30 for words in personal.values())
    owner = {w: client for client, words in personal.items() for w in words}
    assert len(owner) == 200 * 30  # Distinct across clients.
    users = _word_clients(corpus)
    assert not set(owner) & {w for w, by in users.items() if len(by) > 1 or owner.get(w) not in by}
    # A client uses its personal words often: 3-10% of its tokens on average, its top word in most examples' tens.
    shares = []
    for client, examples in _all(corpus).items():
        tokens = [t for e in examples for t in e.split()]
        shares.append(sum(owner.get(t) == client for t in tokens) / len(tokens))
    assert 0.03 < np.mean(shares) < 0.10 and min(shares) > 0.005
    # Globally they are rare: most fall outside the 1K train vocabulary.
    counts = text_corpus.word_counts(corpus.train)
    vocab_1k = set(text_corpus.vocabulary(counts, 1000))
    train_personal = {w for w, client in owner.items() if client in corpus.train and counts[w]}
    assert len(train_personal & vocab_1k) / len(train_personal) < 0.15
    assert sum(counts[w] for w in train_personal - vocab_1k) / sum(counts[w] for w in train_personal) > 0.6
    # Test clients' personal words never occur in train: out of vocabulary at any size.
    test_personal = {w for w, client in owner.items() if client in corpus.test}
    assert not test_personal & counts.keys()
    # Shared words are common_vocab_size at most; all of them are in a 3K vocabulary.
    assert len(counts.keys() - owner.keys()) <= 3000


def test_no_personal_words():
    plain = synthetic_text.generate_text_corpus(personal_words_per_client=0, num_clients=30)
    stats = text_corpus.corpus_statistics(plain, vocab_sizes=(3000,))
    assert stats['train_coverage'][3000] == 1.0 and stats['distinct_train_tokens'] <= 3000
    assert len(_word_clients(plain)) <= 3000  # Train and test together: only the shared vocabulary.


def _entropies(clients):
    unigram, bigram, before = collections.Counter(), collections.Counter(), collections.Counter()
    for examples in clients.values():
        for example in examples:
            tokens = example.split()
            unigram.update(tokens)
            for a, b in zip(tokens, tokens[1:]):
                bigram[a, b] += 1
                before[a] += 1
    n, m = sum(unigram.values()), sum(bigram.values())
    h_unigram = -sum(c / n * math.log2(c / n) for c in unigram.values())
    h_next = -sum(c / m * math.log2(c / before[a]) for (a, _), c in bigram.items())
    return h_unigram, h_next


def test_bigram_structure_makes_next_word_predictable(corpus):
    h_unigram, h_next = _entropies(corpus.train)
    assert h_next < h_unigram - 2.0  # Bits: the previous word says a lot about the next one.
    # Held-out check (the in-sample conditional entropy is biased low): a smoothed bigram model fit on train has a
    # lower test cross-entropy than the smoothed unigram model.
    unigram, bigram, before = collections.Counter(), collections.Counter(), collections.Counter()
    for examples in corpus.train.values():
        for example in examples:
            tokens = example.split()
            unigram.update(tokens)
            for a, b in zip(tokens, tokens[1:]):
                bigram[a, b] += 1
                before[a] += 1
    vocab_size, total = len(unigram) + 1, sum(unigram.values())
    lam = 0.5
    nll_unigram = nll_bigram = pairs = 0
    for examples in corpus.test.values():
        for example in examples:
            tokens = example.split()
            for a, b in zip(tokens, tokens[1:]):
                p_uni = (unigram[b] + 1) / (total + vocab_size)
                p_bi = lam * bigram[a, b] / before[a] + (1 - lam) * p_uni if before[a] else p_uni
                nll_unigram -= math.log2(p_uni)
                nll_bigram -= math.log2(p_bi)
                pairs += 1
    assert nll_bigram / pairs < nll_unigram / pairs - 1.0


def test_questions_start_with_an_auxiliary(corpus):
    aux = {'do', 'is', 'can', 'does', 'are', 'should', 'will', 'did', 'was', 'would', 'could', 'have', 'has'}
    examples = [e.split() for examples in _all(corpus).values() for e in examples]
    questions = [t for t in examples if t[-1] == '?']
    assert questions and all(t[0] in aux for t in questions)
    assert 0.05 < len(questions) / len(examples) < 0.4


def test_settings_are_respected():
    small = synthetic_text.generate_text_corpus(
        num_clients=10,
        examples_per_client=(3, 5),
        common_vocab_size=200,
        personal_words_per_client=2,
        test_fraction=0.3,
        seed=7,
    )
    assert (len(small.train), len(small.test)) == (7, 3)
    assert all(3 <= len(examples) <= 5 for examples in _all(small).values())
    shared = [w for w, by in _word_clients(small).items() if len(by) > 1]
    assert len(shared) <= 200
    assert synthetic_text.generate_text_corpus(num_clients=3, test_fraction=0.0).test == {}


def _word_clients(corpus):
    users = collections.defaultdict(set)
    for client, examples in _all(corpus).items():
        for example in examples:
            for token in example.split():
                users[token].add(client)
    return users


@pytest.mark.parametrize(
    'kwargs, message',
    [
        ({'examples_per_client': (5, 2)}, 'examples_per_client'),
        ({'examples_per_client': (0, 2)}, 'examples_per_client'),
        ({'num_clients': 0}, 'num_clients'),
        ({'common_vocab_size': 50}, 'common_vocab_size'),
        ({'personal_words_per_client': -1}, 'personal_words_per_client'),
        ({'test_fraction': 1.0}, 'test_fraction'),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        synthetic_text.generate_text_corpus(**kwargs)
