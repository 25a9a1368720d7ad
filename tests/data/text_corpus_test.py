"""Tests for fedpersonal.data.text_corpus (TextCorpus, tokenize, vocabulary, client split, statistics)."""

import collections

import pytest

from fedpersonal.data import text_corpus
from fedpersonal.data.text_corpus import TextCorpus


@pytest.mark.parametrize(
    'text, tokens',
    [
        ('How do I sort a list?', ['how', 'do', 'i', 'sort', 'a', 'list', '?']),
        (
            "'Tis now struck twelve; get thee to bed, Francisco.",
            ["'tis", 'now', 'struck', 'twelve', ';', 'get', 'thee', 'to', 'bed', ',', 'francisco', '.'],
        ),
        (
            "What, has this thing appear'd again to-night?",
            ['what', ',', 'has', 'this', 'thing', "appear'd", 'again', 'to', 'night', '?'],
        ),
        (
            "I' th' name of Dian, o'er the lovers' heads!",
            ["i'", "th'", 'name', 'of', 'dian', ',', "o'er", 'the', 'lovers', 'heads', '!'],
        ),
        ("'to be acknown' is to acknowledge", ['to', 'be', 'acknown', 'is', 'to', 'acknowledge']),  # Quotes dropped.
        (
            "Who's there? Stand, ho! 'Twas 'gainst is't",
            ["who's", 'there', '?', 'stand', ',', 'ho', '!', "'twas", "'gainst", "is't"],
        ),
        ('[Within] Lord Hamlet,-- & | (aside) "quoted"', ['within', 'lord', 'hamlet', ',', 'aside', 'quoted']),
        ('Café 2nd v3.14: ÜBER', ['café', '2nd', 'v3', '.', '14', ':', 'über']),
        ('Don\u2019t', ["don't"]),
        ('', []),
        ("-- ' [ ]", []),
    ],
)
def test_tokenize(text, tokens):
    assert text_corpus.tokenize(text) == tokens


def test_word_counts_and_vocabulary_ties_alphabetical():
    clients = {'a': ['b a c .', 'a a'], 'b': ['c b .']}
    counts = text_corpus.word_counts(clients)
    assert counts == collections.Counter({'a': 3, 'b': 2, 'c': 2, '.': 2})
    # 'a' (3), then the ties '.', 'b', 'c' (2 each) in alphabetical order.
    assert text_corpus.vocabulary(counts, 3) == ['a', '.', 'b']
    assert text_corpus.vocabulary(counts, 10) == ['a', '.', 'b', 'c']  # Fewer distinct tokens than asked.
    assert text_corpus.vocabulary(counts, 0) == []
    assert text_corpus.vocabulary(collections.Counter({'x': 0, 'y': 1}), 5) == ['y']
    # Deterministic regardless of insertion order.
    assert text_corpus.vocabulary(dict(reversed(list(counts.items()))), 4) == ['a', '.', 'b', 'c']
    with pytest.raises(ValueError, match='size'):
        text_corpus.vocabulary(counts, -1)


def _clients(n):
    return {f'c{i:02d}': [f'w{i} .'] * (i + 1) for i in range(n)}


def test_split_clients_is_deterministic_client_level_and_keeps_order():
    clients = _clients(20)
    train, test = text_corpus.split_clients(clients, 0.25, seed=3)
    assert len(test) == 5 and len(train) == 15
    assert train.keys().isdisjoint(test.keys()) and train.keys() | test.keys() == clients.keys()
    assert all(train[c] == clients[c] for c in train) and all(test[c] == clients[c] for c in test)
    assert list(train) == [c for c in clients if c in train]  # Input order kept.
    assert text_corpus.split_clients(clients, 0.25, seed=3) == (train, test)
    # The choice depends on the ids and the seed, not on the input order.
    shuffled = dict(reversed(list(clients.items())))
    assert set(text_corpus.split_clients(shuffled, 0.25, seed=3)[1]) == set(test)
    assert any(set(text_corpus.split_clients(clients, 0.25, seed=s)[1]) != set(test) for s in range(4, 8))


def test_split_clients_edge_fractions():
    assert len(text_corpus.split_clients(_clients(10), 0.0, seed=0)[1]) == 0
    assert len(text_corpus.split_clients(_clients(10), 0.01, seed=0)[1]) == 1  # At least one test client.
    assert len(text_corpus.split_clients(_clients(2), 0.9, seed=0)[0]) == 1  # At least one train client.
    assert text_corpus.split_clients(_clients(1), 0.5, seed=0)[1] == {}
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match='test_fraction'):
            text_corpus.split_clients(_clients(3), bad, seed=0)


def test_text_corpus_validates():
    with pytest.raises(ValueError, match='both the train and the test side'):
        TextCorpus('x', {'a': ['x .']}, {'a': ['y .']}, 'src')
    with pytest.raises(ValueError, match="train client 'a' example 1"):
        TextCorpus('x', {'a': ['x .', '  ']}, {}, 'src')
    with pytest.raises(ValueError, match="test client 'b' has no examples"):
        TextCorpus('x', {'a': ['x .']}, {'b': []}, 'src')
    with pytest.raises(ValueError, match='list of strings'):
        TextCorpus('x', {'a': 'x .'}, {}, 'src')
    corpus = TextCorpus('x', {'a': ['x .']}, {'b': ['y']}, 'src')
    assert (corpus.num_train_clients, corpus.num_test_clients) == (1, 1)


def test_corpus_statistics_exact():
    corpus = TextCorpus(
        name='tiny',
        source='hand-made',
        train={'a': ['the cat sat .', 'the dog'], 'b': ['the cat'], 'c': ['a b c d e f', 'x', 'y']},
        test={'t': ['the cat ran .', 'zebra']},
    )
    stats = text_corpus.corpus_statistics(corpus, vocab_sizes=(1, 2, 100))
    assert stats['name'] == 'tiny' and stats['source'] == 'hand-made'
    assert stats['train'] == {
        'clients': 3,
        'examples': 6,
        'tokens': 16,
        'examples_per_client': {'min': 1, 'median': 2.0, 'max': 3},
        'tokens_per_example': {'min': 1, 'median': 2.0, 'max': 6},
    }
    assert stats['test']['clients'] == 1 and stats['test']['tokens'] == 5
    assert stats['distinct_train_tokens'] == 13
    # Train vocab: 'the' (3), then 'cat' (2), then ties alphabetically.
    assert stats['train_coverage'] == {1: 3 / 16, 2: 5 / 16, 100: 1.0}
    assert stats['test_coverage'] == {1: 1 / 5, 2: 2 / 5, 100: 3 / 5}  # 'ran' and 'zebra' are not in train.


def test_corpus_statistics_empty_test_side():
    stats = text_corpus.corpus_statistics(TextCorpus('x', {'a': ['x']}, {}, 's'), vocab_sizes=(5,))
    assert stats['test']['examples_per_client'] == {'min': 0, 'median': 0.0, 'max': 0}
    assert stats['test_coverage'] == {5: 0.0}


def test_limit_examples_keeps_first_in_time_order():
    corpus = TextCorpus('x', {'a': ['1', '2', '3'], 'b': ['4']}, {'c': ['5', '6']}, 'src')
    limited = text_corpus.limit_examples(corpus, 2)
    assert limited.train == {'a': ['1', '2'], 'b': ['4']} and limited.test == {'c': ['5', '6']}
    assert limited.name == 'x' and 'first 2 examples' in limited.source
    assert corpus.train['a'] == ['1', '2', '3']  # The input is not modified.
    with pytest.raises(ValueError, match='max_examples_per_client'):
        text_corpus.limit_examples(corpus, 0)
