"""A generated next-word-prediction corpus with personal words: the default text data when no real corpus is present.

`generate_text_corpus` draws a `text_corpus.TextCorpus` of chat / Q&A-like sentences with the properties the
FedRecon next-word experiment depends on:

* **Zipfian vocabulary with local structure.** Tokens follow a seeded Markov chain over word classes (pronoun,
  determiner, auxiliary, preposition, conjunction -- real English function words -- and pseudo-word nouns, verbs,
  adjectives, adverbs and names, plus commas), so the next token is far more predictable from the current one than
  from unigram frequencies: e.g. a determiner is followed by an adjective or noun, a question starts with an
  auxiliary and ends with ``?``. Within a class words are Zipfian (exponent 1.05) over a seeded ranking, and each
  word has a fixed favourite successor in each class that is taken with probability 0.35 (collocations).
* **Sentences of 5-30 tokens**: ``3 + LogNormal(log 8, 0.6)`` word slots clipped to 4-29 (median 11), commas
  included, then ``.``, ``!`` or ``?``. One sentence is one example, as in TFF's Stack Overflow data.
* **Personal words.** Each client owns `personal_words_per_client` pseudo-words that no other client uses (names,
  nicknames, slang). A name slot takes one of them with probability 0.7 and a noun slot with probability 0.06
  (Zipfian over the client's list), so a client uses its personal words often while each one is rare globally:
  they mostly fall outside a small global vocabulary, which is what local (per-client) OOV embeddings can exploit.
* **Heavy-tailed client sizes**: the number of examples of a client is drawn from a discrete power law
  ``P(n) ~ n^-1.6`` on ``examples_per_client = (lo, hi)`` (most clients near ``lo``, a few near ``hi``).

Clients are ``'user_0000'``, ``'user_0001'``, ...; ``test_fraction`` of them are held out as test clients with
`text_corpus.split_clients`. All draws come from ``np.random.default_rng(seed)``: the corpus is a function of the
arguments.

Measured with the defaults (seed 0; ~0.35 s): 200 clients (160 train / 40 test), 9,134 examples, 122,497 tokens,
12 tokens per example (median; 5-30), examples per train client min 20 / median 40 / max 120; unigram entropy 8.0
bits vs 4.8 bits for the next token given the current one; personal words are ~5% of a client's tokens, and ~93%
of the train clients' personal words (~70% of their uses) are outside the 1K train vocabulary; a 1K vocabulary
covers 92.6% of the train tokens and 90.7% of the test tokens (a 5K one 100% / 95%: test clients' personal words
never occur in train).
tests/data/synthetic_text_test.py checks these properties.
"""

from __future__ import annotations

import bisect

import numpy as np

from fedpersonal import errors
from fedpersonal.data import text_corpus

__all__ = ['generate_text_corpus', 'generate_text_corpus_with_personal_words']

# Word classes. The closed classes use real English function words; the open ones get seeded pseudo-words.
_FUNCTION_WORDS = {
    'PRON': ['i', 'you', 'it', 'we', 'they', 'he', 'she', 'this', 'that', 'someone'],
    'DET': ['the', 'a', 'my', 'your', 'this', 'some', 'any', 'no', 'every', 'our', 'an', 'their'],
    'AUX': ['do', 'is', 'can', 'does', 'are', 'should', 'will', 'did', 'was', 'would', 'could', 'have', 'has'],
    'PREP': ['to', 'in', 'for', 'with', 'on', 'of', 'from', 'at', 'by', 'about', 'into', 'after', 'over', 'without'],
    'CONJ': ['and', 'but', 'or', 'so', 'because', 'if', 'when', 'while', 'then'],
}
_OPEN_CLASS_SHARES = {'NOUN': 0.45, 'VERB': 0.25, 'ADJ': 0.15, 'ADV': 0.08, 'NAME': 0.07}
_CLASSES = ['PRON', 'DET', 'AUX', 'PREP', 'CONJ', 'NOUN', 'VERB', 'ADJ', 'ADV', 'NAME', 'COMMA']
_START = {'PRON': 0.3, 'DET': 0.2, 'NAME': 0.1, 'ADV': 0.05, 'AUX': 0.15, 'VERB': 0.1, 'PREP': 0.05, 'CONJ': 0.05}
_TRANSITIONS = {
    'PRON': {'VERB': 0.6, 'AUX': 0.3, 'ADV': 0.1},
    'DET': {'NOUN': 0.65, 'ADJ': 0.35},
    'AUX': {'PRON': 0.35, 'VERB': 0.35, 'DET': 0.1, 'ADV': 0.1, 'ADJ': 0.1},
    'PREP': {'DET': 0.5, 'NOUN': 0.2, 'NAME': 0.2, 'PRON': 0.1},
    'CONJ': {'PRON': 0.4, 'DET': 0.3, 'NAME': 0.15, 'VERB': 0.15},
    'NOUN': {'VERB': 0.25, 'PREP': 0.3, 'CONJ': 0.15, 'COMMA': 0.15, 'AUX': 0.15},
    'VERB': {'DET': 0.35, 'PRON': 0.15, 'PREP': 0.2, 'ADV': 0.15, 'NAME': 0.15},
    'ADJ': {'NOUN': 0.8, 'ADJ': 0.05, 'COMMA': 0.05, 'CONJ': 0.1},
    'ADV': {'VERB': 0.4, 'ADJ': 0.3, 'PREP': 0.2, 'COMMA': 0.1},
    'NAME': {'VERB': 0.35, 'AUX': 0.2, 'COMMA': 0.2, 'CONJ': 0.15, 'PREP': 0.1},
    'COMMA': {'CONJ': 0.4, 'PRON': 0.3, 'DET': 0.2, 'NAME': 0.1},
}
_ZIPF_EXPONENT = 1.05
_PUNCTUATION = (',', '.', '?', '!')
_COLLOCATION_PROB = 0.35
_PERSONAL_NAME_PROB = 0.7
_PERSONAL_NOUN_PROB = 0.06
_SIZE_EXPONENT = 1.6
_LENGTH_LOG_MEAN = np.log(8.0)
_LENGTH_LOG_SIGMA = 0.6
_MIN_WORDS, _MAX_WORDS = 4, 29  # Word slots (commas included) before the end mark: 5-30 tokens per sentence.
_SYLLABLES = (
    [c + v for c in 'bdfgklmnprstvz' for v in 'aeiou'] + ['ch' + v for v in 'aeiou'] + ['sh' + v for v in 'aeiou']
)
_CODAS = ['', '', '', 'n', 'r', 's', 'l', 'x', 'k', 'm', 't']


def _pseudo_words(rng: np.random.Generator, n: int, taken: set[str]) -> list[str]:
    """`n` distinct pronounceable lower-case pseudo-words (2-4 syllables) not in `taken` (which is updated)."""
    out: list[str] = []
    while len(out) < n:
        m = 2 * (n - len(out)) + 16
        counts = rng.choice([2, 3, 4], size=m, p=[0.45, 0.4, 0.15])
        syllables = rng.integers(0, len(_SYLLABLES), size=(m, 4))
        codas = rng.integers(0, len(_CODAS), size=m)
        for k, row, coda in zip(counts, syllables, codas):
            word = ''.join(_SYLLABLES[s] for s in row[:k]) + _CODAS[coda]
            if word not in taken:
                taken.add(word)
                out.append(word)
                if len(out) == n:
                    break
    return out


def _zipf_cdf(n: int) -> np.ndarray:
    weights = np.arange(1, n + 1, dtype=np.float64) ** -_ZIPF_EXPONENT
    cdf = np.cumsum(weights / weights.sum())
    cdf[-1] = 1.0
    return cdf


def generate_text_corpus(
    *,
    num_clients: int = 200,
    examples_per_client: tuple[int, int] = (20, 120),
    common_vocab_size: int = 3000,
    personal_words_per_client: int = 30,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> text_corpus.TextCorpus:
    """Draws a synthetic next-word-prediction corpus (see the module docstring).

    Args:
        num_clients: Number of clients (>= 1; with one client there is no test client).
        examples_per_client: ``(lo, hi)``: each client has ``lo <= n <= hi`` examples (heavy-tailed).
        common_vocab_size: Number of distinct shared tokens (function words, pseudo-words and the punctuation
            tokens ``, . ? !``), >= 100.
        personal_words_per_client: Number of words private to each client (>= 0; 0 disables personal words).
        test_fraction: Fraction of the clients held out as test clients, in [0, 1).
        seed: Seed of every draw.

    Returns:
        A `text_corpus.TextCorpus` named ``'synthetic_text'``; `source` lists the settings.
    """
    return generate_text_corpus_with_personal_words(
        num_clients=num_clients,
        examples_per_client=examples_per_client,
        common_vocab_size=common_vocab_size,
        personal_words_per_client=personal_words_per_client,
        test_fraction=test_fraction,
        seed=seed,
    )[0]


def generate_text_corpus_with_personal_words(
    *,
    num_clients: int = 200,
    examples_per_client: tuple[int, int] = (20, 120),
    common_vocab_size: int = 3000,
    personal_words_per_client: int = 30,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[text_corpus.TextCorpus, dict[str, list[str]]]:
    """`generate_text_corpus`, plus every client's personal words (e.g. to score predictions of personal words).

    Args: as `generate_text_corpus`.

    Returns:
        ``(corpus, personal)``: the corpus of `generate_text_corpus` and client id -> that client's personal words
        (most frequently used first; a client may not use all of them), for train and test clients.
    """
    lo, hi = examples_per_client
    if not 1 <= lo <= hi:
        raise errors.ConfigError(
            f'examples_per_client must be (lo, hi) with 1 <= lo <= hi, got {examples_per_client!r}'
        )
    if num_clients < 1:
        raise errors.ConfigError(f'num_clients must be >= 1, got {num_clients}')
    num_function = len({w for words in _FUNCTION_WORDS.values() for w in words})
    if common_vocab_size < 100:
        raise errors.ConfigError(f'common_vocab_size must be >= 100, got {common_vocab_size}')
    if personal_words_per_client < 0:
        raise errors.ConfigError(f'personal_words_per_client must be >= 0, got {personal_words_per_client}')
    if not 0.0 <= test_fraction < 1.0:
        raise errors.ConfigError(f'test_fraction must be in [0, 1), got {test_fraction!r}')
    rng = np.random.default_rng(seed)

    # Vocabulary: function words, then open-class pseudo-words, then every client's personal words.
    taken = {w for words in _FUNCTION_WORDS.values() for w in words}
    num_open = common_vocab_size - num_function - len(_PUNCTUATION)
    open_sizes = {c: max(5, int(round(share * num_open))) for c, share in _OPEN_CLASS_SHARES.items()}
    open_sizes['NOUN'] += num_open - sum(open_sizes.values())
    class_words = {c: list(words) for c, words in _FUNCTION_WORDS.items()}
    for c, size in open_sizes.items():
        class_words[c] = _pseudo_words(rng, size, taken)
    class_words['COMMA'] = [',']
    personal = [_pseudo_words(rng, personal_words_per_client, taken) for _ in range(num_clients)]

    # Vocabulary as one array; per class: word ids in Zipf rank order (a seeded ranking) and the Zipf CDF.
    vocab: list[str] = []
    class_ids: list[np.ndarray] = []
    for c in _CLASSES:
        words = class_words[c]
        ids = np.arange(len(vocab), len(vocab) + len(words))
        vocab.extend(words)
        class_ids.append(ids[rng.permutation(len(ids))])
    class_cdfs = [_zipf_cdf(len(ids)) for ids in class_ids]
    num_classes = len(_CLASSES)
    index = {c: i for i, c in enumerate(_CLASSES)}
    start_cdf = np.cumsum([_START.get(c, 0.0) for c in _CLASSES])
    transition_cdf = np.array([np.cumsum([_TRANSITIONS[a].get(b, 0.0) for b in _CLASSES]) for a in _CLASSES])
    start_cdf /= start_cdf[-1]
    transition_cdf /= transition_cdf[:, -1:]
    # Favourite successor of every word in every class (drawn from that class's Zipf distribution).
    successor = np.empty((len(vocab), num_classes), dtype=np.int64)
    for k in range(num_classes):
        ranks = np.searchsorted(class_cdfs[k], rng.random(len(vocab)))
        successor[:, k] = class_ids[k][ranks]
    personal_cdf = _zipf_cdf(max(personal_words_per_client, 1))
    name_class, noun_class, aux_class, comma_class = index['NAME'], index['NOUN'], index['AUX'], index['COMMA']

    # Heavy-tailed client sizes, then sentence lengths (word slots) and the uniforms of every slot.
    sizes = np.arange(lo, hi + 1)
    size_p = sizes.astype(np.float64) ** -_SIZE_EXPONENT
    client_sizes = rng.choice(sizes, size=num_clients, p=size_p / size_p.sum())
    num_sentences = int(client_sizes.sum())
    lengths = np.clip(
        np.round(_MIN_WORDS - 1 + rng.lognormal(_LENGTH_LOG_MEAN, _LENGTH_LOG_SIGMA, num_sentences)),
        _MIN_WORDS,
        _MAX_WORDS,
    ).astype(np.int64)
    total = int(lengths.sum())
    u_class, u_word, u_colloc, u_personal = (rng.random(total) for _ in range(4))
    u_end = rng.random(num_sentences)

    # Class of every slot: the Markov chain (sequential, on Python lists for speed).
    start_list, transition_lists = start_cdf.tolist(), transition_cdf.tolist()
    comma_list = transition_lists[comma_class]
    last = num_classes - 1
    classes = [0] * total
    pos = 0
    for length in lengths.tolist():
        state = min(bisect.bisect_right(start_list, u_class[pos]), last)
        classes[pos] = state
        for slot in range(1, length):
            pos += 1
            state = min(bisect.bisect_right(transition_lists[state], u_class[pos]), last)
            if state == comma_class and slot == length - 1:  # No comma right before the end mark.
                state = min(bisect.bisect_right(comma_list, u_class[pos]), last)
            classes[pos] = state
        pos += 1
    class_array = np.asarray(classes, dtype=np.int64)

    # A fresh Zipfian word of its class for every slot (vectorized per class), and whether it is personal.
    fresh = np.empty(total, dtype=np.int64)
    for k in range(num_classes):
        at = np.flatnonzero(class_array == k)
        fresh[at] = class_ids[k][np.searchsorted(class_cdfs[k], u_word[at])]
    is_personal = np.zeros(total, dtype=bool)
    if personal_words_per_client:
        is_personal = ((class_array == name_class) & (u_personal < _PERSONAL_NAME_PROB)) | (
            (class_array == noun_class) & (u_personal < _PERSONAL_NOUN_PROB)
        )
    personal_rank = np.searchsorted(personal_cdf, u_word).tolist()
    colloc = (u_colloc < _COLLOCATION_PROB).tolist()
    fresh_list, personal_list, successor_list = fresh.tolist(), is_personal.tolist(), successor.tolist()

    # Tokens: collocations chain word to word (sequential); personal slots break the chain.
    clients: dict[str, list[str]] = {}
    width = max(4, len(str(num_clients - 1)))
    pos = sentence = 0
    for client, num_examples in enumerate(client_sizes.tolist()):
        own = personal[client]
        examples = []
        for _ in range(num_examples):
            length = int(lengths[sentence])
            first_class = classes[pos]
            tokens = []
            word = -1
            for p in range(pos, pos + length):
                if personal_list[p]:
                    tokens.append(own[personal_rank[p]])
                    word = -1
                    continue
                if word >= 0 and colloc[p]:
                    word = successor_list[word][classes[p]]
                else:
                    word = fresh_list[p]
                tokens.append(vocab[word])
            if first_class == aux_class:
                tokens.append('?')
            else:
                tokens.append('!' if u_end[sentence] < 0.12 else '.')
            examples.append(' '.join(tokens))
            pos += length
            sentence += 1
        clients[f'user_{client:0{width}d}'] = examples

    train, test = text_corpus.split_clients(clients, test_fraction, seed)
    source = (
        f'synthetic_text(num_clients={num_clients}, examples_per_client={tuple(examples_per_client)}, '
        f'common_vocab_size={common_vocab_size}, personal_words_per_client={personal_words_per_client}, '
        f'test_fraction={test_fraction}, seed={seed})'
    )
    corpus = text_corpus.TextCorpus(name='synthetic_text', train=train, test=test, source=source)
    return corpus, {f'user_{client:0{width}d}': list(words) for client, words in enumerate(personal)}
