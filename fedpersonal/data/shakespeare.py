"""Shakespeare's plays as a federated next-word-prediction corpus: one client per (play, speaking role).

Reads the Moby "complete works with speakers" text (``shakespeare.txt``, or the ``.zip`` holding it), one line per
text line::

    work@offset<TAB>SPEAKER<TAB>text

where ``offset`` is the character offset of the line in the work. An empty SPEAKER continues the current speech and
lines with neither speaker nor text separate speeches. Text may itself contain tabs (read as spaces). As in LEAF and
TFF's Shakespeare data, every (play, role) is one client, with id ``"<work>_<SPEAKER>"`` reduced to ``[A-Za-z0-9_]``
(e.g. ``hamlet_HAMLET``, ``comedyoferrors_ANTIPHOLUS_OF_EPHESUS``); each speech is one example (its lines joined,
stage directions removed, then `text_corpus.tokenize`-d), in offset order, which is the time order.

What the real file holds and how each part is read:

* **Plays** (37) start with a title and a cast list (a line reading ``DRAMATIS PERSONAE``, then ``ROLE<TAB>
  description`` lines). That front matter is skipped up to the first ``ACT``/``SCENE <numeral>`` heading or
  ``PROLOGUE``/``INDUCTION`` line.
* **Headings** (SPEAKER ``ACT I``, ``SCENE II``, ``SCENE II: Belmont...``) end the current speech and are dropped.
* **Stage directions** are bracketed (``[Exit]``, ``[Aside]``, ``[Enter Ghost]``, possibly over several lines) and
  are removed; a text line with no current speaker (``[Enter HORATIO]``, ``PROLOGUE``, running titles) belongs to
  no speech and is dropped.
* **Names over two lines**: a SPEAKER line without text followed by another SPEAKER line is one name
  (``ANTIPHOLUS`` + ``OF EPHESUS``, ``BISHOP`` + ``OF WINCHESTER``, ``DON`` + ``PEDRO``).
* **Joint speeches** are braced with ``|`` (``MARCELLUS<TAB>|`` / ``<TAB>|<TAB>We do, my lord.`` /
  ``BERNARDO<TAB>|``): the text is one speech of every braced speaker.
* **A text run into the SPEAKER field** (``CASSIO: Good night, honest Iago.``) is split at the first colon.
* **Other works** (sonnets, poems, the glossary, the file's README) have no cast list and no speakers: they are
  skipped (``plays_only=False`` reads every work without a cast list as dialogue from its first line instead, which
  suits hand-written files without cast lists; the Moby poems then still yield no speeches, since their verse is in
  the SPEAKER column with no text column, but glossary headwords become tiny clients).

Statistics of the real file: see `load_shakespeare`.

Malformed input raises `ShakespeareFormatError` naming the file (and zip member) and the 1-based line.
"""

from __future__ import annotations

import dataclasses
import os
import re
import zipfile

from fedpersonal import errors
from fedpersonal.data import text_corpus

__all__ = ['ShakespeareFormatError', 'Speech', 'client_id', 'load_shakespeare', 'read_speeches']

_FILE_NAMES = ('shakespeare.txt', 'shakespeare.txt.zip')
_CAST_LIST = 'DRAMATIS PERSONAE'
_HEADING = re.compile(r'(ACT|SCENE)\b')  # On the SPEAKER field: a heading line, never a speaker.
_SECTION_START = re.compile(r'(ACT|SCENE)\s+[IVXLC]+\b')  # On SPEAKER: first line after the cast list.
_SECTION_START_TEXT = re.compile(r'(PROLOGUE|INDUCTION)\.?')  # Same, on the text of a line without SPEAKER.
_BRACKETED = re.compile(r'\[[^\[\]]*\]')
_UNCLOSED = re.compile(r'\[[^\]]*$')
_UNOPENED = re.compile(r'^[^\[]*\]')
_ID_UNSAFE = re.compile(r'[^A-Za-z0-9]+')
_KEY = re.compile(r'(\S(?:.*\S)?)@([0-9]{1,15})')  # work@offset; the work may contain '@' but not edge spaces.


class ShakespeareFormatError(errors.DataError):
    """The Shakespeare file is missing or malformed.

    Attributes:
        path: The offending file, directory or zip archive.
        line: The 1-based line number, or None.
    """

    def __init__(self, message: str, *, path: str, line: int | None = None):
        super().__init__(message)
        self.path = path
        self.line = line


@dataclasses.dataclass(frozen=True)
class Speech:
    """One speech of one role.

    Attributes:
        work: The work (play) name, e.g. ``'hamlet'``.
        speaker: The role, whitespace-normalized, e.g. ``'ANTIPHOLUS OF EPHESUS'``.
        offset: The offset of the speech's first line in the work.
        line: The 1-based file line of the speech's first line.
        text: The speech's lines joined by spaces, stage directions removed (not tokenized).
    """

    work: str
    speaker: str
    offset: int
    line: int
    text: str


@dataclasses.dataclass
class _Entry:
    offset: int
    line: int
    speaker: str
    text: str


def client_id(work: str, speaker: str) -> str:
    """The client id of a role: ``"<work>_<speaker>"`` with each run of characters outside [A-Za-z0-9] -> ``_``."""
    return _ID_UNSAFE.sub('_', f'{work}_{speaker}').strip('_')


def _read_text(path: str) -> tuple[str, str]:
    """Returns (name for messages, decoded text) of the file, zip or directory `path`."""
    path = os.fspath(path)
    if os.path.isdir(path):
        for name in _FILE_NAMES:
            if os.path.isfile(os.path.join(path, name)):
                path = os.path.join(path, name)
                break
        else:
            raise ShakespeareFormatError(f'{path}: directory has neither of {", ".join(_FILE_NAMES)}', path=path)
    if not os.path.isfile(path):
        raise ShakespeareFormatError(
            f'{path}: file not found (expected shakespeare.txt, its .zip, or a directory holding either)', path=path
        )
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                members = [
                    info
                    for info in archive.infolist()
                    if not info.is_dir()
                    and not info.filename.startswith('__MACOSX/')
                    and not os.path.basename(info.filename).startswith('.')
                ]
                if len(members) > 1:
                    members = [info for info in members if info.filename.lower().endswith('.txt')]
                if len(members) != 1:
                    raise ShakespeareFormatError(
                        f'{path}: expected a zip holding one text file, found '
                        f'{[info.filename for info in archive.infolist()]}',
                        path=path,
                    )
                name = f'{path} (member {members[0].filename})'
                data = archive.read(members[0])
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as e:
            raise ShakespeareFormatError(f'{path}: unreadable zip archive ({e})', path=path) from None
    else:
        name = path
        with open(path, 'rb') as f:
            data = f.read()
    try:
        text = data.decode('utf-8-sig')
    except UnicodeDecodeError as e:
        line = data.count(b'\n', 0, e.start) + 1
        raise ShakespeareFormatError(
            f'{name} line {line}: not valid UTF-8 text ({e.reason})', path=path, line=line
        ) from None
    return name, text


def _parse_lines(name: str, path: str, text: str) -> dict[str, list[_Entry]]:
    """Splits the file into works: work -> entries sorted by offset."""
    lines = text.split('\n')
    while lines and not lines[-1].strip():
        lines.pop()
    works: dict[str, list[_Entry]] = {}
    first_line: dict[tuple[str, int], int] = {}
    for lineno, raw in enumerate(lines, start=1):
        if raw.endswith('\r'):
            raw = raw[:-1]
        fields = raw.split('\t')
        key_match = _KEY.fullmatch(fields[0])
        if len(fields) < 2 or key_match is None:
            if not raw.strip():
                reason = 'empty line (every line starts with work@offset and a tab)'
            elif len(fields) < 2:
                reason = f'no tab: expected work@offset<TAB>SPEAKER<TAB>text, got {raw[:80]!r}'
            else:
                reason = f'expected work@offset (offset a non-negative integer) before the first tab, got {fields[0]!r}'
            raise ShakespeareFormatError(f'{name} line {lineno}: {reason}', path=path, line=lineno)
        work = key_match.group(1)
        key = (work, int(key_match.group(2)))
        if key in first_line:
            raise ShakespeareFormatError(
                f'{name} line {lineno}: duplicate offset {fields[0]!r} (first on line {first_line[key]})',
                path=path,
                line=lineno,
            )
        first_line[key] = lineno
        speaker = ' '.join(fields[1].split()) if fields[1] else ''
        body = ' '.join(fields[2:])
        if ':' in speaker:  # "CASSIO: Good night, honest Iago." -> speaker CASSIO, text after the colon.
            head, _, rest = speaker.partition(':')
            if head.strip():
                speaker, body = head.strip(), f'{rest} {body}'
        speaker = speaker.rstrip('.,;: ')
        works.setdefault(work, []).append(_Entry(key[1], lineno, speaker, body))
    if not works:
        raise ShakespeareFormatError(f'{name}: no lines', path=path)
    for entries in works.values():
        entries.sort(key=lambda e: e.offset)
    return works


def _clean(text: str) -> str:
    """Removes bracketed stage directions (also unclosed or unopened ones at the ends) and brace bars."""
    text = _BRACKETED.sub(' ', text)
    text = _UNCLOSED.sub(' ', text)
    text = _UNOPENED.sub(' ', text)
    return ' '.join(text.replace('|', ' ').split())


def _block_speeches(work: str, block: list[_Entry]) -> list[Speech]:
    """The speeches of one run of non-blank lines (see the module docstring)."""
    if any(e.speaker and '|' in e.text for e in block):  # A brace: a joint speech of all braced speakers.
        speakers = list(dict.fromkeys(e.speaker for e in block if e.speaker))
        text = _clean(' '.join(e.text for e in block))
        first = next(e for e in block if e.speaker)
        return [Speech(work, s, first.offset, first.line, text) for s in speakers] if text else []
    speeches: list[Speech] = []
    name_parts: list[str] = []
    current: list = []  # [speaker, first entry, texts]

    def finish():
        if current:
            text = _clean(' '.join(current[2]))
            if text:
                speeches.append(Speech(work, current[0], current[1].offset, current[1].line, text))
            current.clear()

    name_start = None  # The entry of the first name part: where the speech starts.
    for e in block:
        if e.speaker:
            finish()
            if not e.text.strip():  # A name (part) alone: the speech, or the rest of the name, follows.
                name_parts.append(e.speaker)
                name_start = name_start or e
                continue
            current.extend([' '.join(name_parts + [e.speaker]), name_start or e, [e.text]])
            name_parts, name_start = [], None
        elif current:
            current[2].append(e.text)
        elif name_parts:
            current.extend([' '.join(name_parts), name_start, [e.text]])
            name_parts, name_start = [], None
        # else: a line outside any speech (stage direction, title): dropped.
    finish()
    return speeches


def _work_speeches(name: str, path: str, work: str, entries: list[_Entry], plays_only: bool) -> list[Speech] | None:
    """The speeches of one work, or None when it is skipped (no cast list and `plays_only`)."""
    cast = next(
        (i for i, e in enumerate(entries) if _CAST_LIST in (e.speaker.upper(), ' '.join(e.text.split()).upper())), None
    )
    start: int | None
    if cast is None:
        if plays_only:
            return None
        start = 0
    else:
        start = next(
            (
                i
                for i in range(cast + 1, len(entries))
                if _SECTION_START.match(entries[i].speaker)
                or (not entries[i].speaker and _SECTION_START_TEXT.fullmatch(entries[i].text.strip()))
            ),
            None,
        )
        if start is None:
            line = entries[cast].line
            raise ShakespeareFormatError(
                f'{name} line {line}: the cast list of {work!r} is not followed by an ACT/SCENE heading or a '
                f'PROLOGUE/INDUCTION line',
                path=path,
                line=line,
            )
    speeches: list[Speech] = []
    block: list[_Entry] = []
    for e in entries[start:]:
        if (not e.speaker and not e.text.strip()) or _HEADING.match(e.speaker):
            speeches.extend(_block_speeches(work, block))
            block = []
        else:
            block.append(e)
    speeches.extend(_block_speeches(work, block))
    return speeches


def _read(path: str, plays_only: bool) -> tuple[list[Speech], list[str], list[str]]:
    name, text = _read_text(path)
    works = _parse_lines(name, os.fspath(path), text)
    speeches, read, skipped = [], [], []
    for work, entries in works.items():
        found = _work_speeches(name, os.fspath(path), work, entries, plays_only)
        if found is None:
            skipped.append(work)
        else:
            read.append(work)
            speeches.extend(found)
    return speeches, read, skipped


def read_speeches(path: str, *, plays_only: bool = True) -> list[Speech]:
    """All speeches of the file, grouped by work (in order of first appearance) and in offset order within a work.

    Args:
        path: ``shakespeare.txt``, the ``.zip`` holding it, or a directory holding either.
        plays_only: Skip works without a ``DRAMATIS PERSONAE`` cast list (see the module docstring).

    Raises:
        ShakespeareFormatError: The file is missing, unreadable or malformed (names the file and 1-based line).
    """
    return _read(path, plays_only)[0]


def load_shakespeare(
    path: str, *, min_examples: int = 20, test_fraction: float = 0.2, seed: int = 0, plays_only: bool = True
) -> text_corpus.TextCorpus:
    """Loads the plays as a `text_corpus.TextCorpus`: one client per (play, role), one example per speech.

    On the Moby file (``/work/shared/data/shakespeare/shakespeare.txt.zip``) with the defaults: 37 plays read (7
    other works skipped); 1,347 roles with at least one speech (31,027 speeches, 920,792 tokens), of which 413 have
    >= 20 speeches. Those 413 clients (330 train / 83 test) hold 25,686 speeches and 775,235 tokens; examples per
    client: min 20, median 48.5, max 359 (train); a 1K / 5K / 10K train vocabulary covers 84.2% / 95.1% / 98.0% of
    the train tokens and 83.4% / 93.8% / 96.5% of the test tokens (`text_corpus.corpus_statistics`). (The data
    README's "3,834 roles, 420 with >= 20 speeches" count differently: e.g. verse lines of the poems as speakers.)

    Args:
        path: ``shakespeare.txt``, the ``.zip`` holding it, or a directory holding either.
        min_examples: Roles with fewer speeches (after tokenization, empty speeches dropped) are not clients.
        test_fraction: Fraction of the clients held out as test clients (`text_corpus.split_clients`).
        seed: Seed of the client split.
        plays_only: Skip works without a cast list (see the module docstring).

    Returns:
        The corpus, named ``'shakespeare'``; clients in file order on each side.

    Raises:
        ShakespeareFormatError: The file is missing, unreadable or malformed (names the file and 1-based line).
        ValueError: Bad arguments, or no role has `min_examples` speeches.
    """
    if isinstance(min_examples, bool) or not isinstance(min_examples, int) or min_examples < 1:
        raise errors.ConfigError(f'min_examples must be a positive integer, got {min_examples!r}')
    speeches, read, skipped = _read(path, plays_only)
    clients: dict[str, list[str]] = {}
    for speech in speeches:
        tokens = text_corpus.tokenize(speech.text)
        if tokens:
            clients.setdefault(client_id(speech.work, speech.speaker), []).append(' '.join(tokens))
    num_roles = len(clients)
    clients = {c: examples for c, examples in clients.items() if len(examples) >= min_examples}
    if not clients:
        raise errors.DataError(
            f'{os.fspath(path)}: no role has at least min_examples={min_examples} speeches '
            f'({num_roles} roles, {len(read)} works read)'
        )
    train, test = text_corpus.split_clients(clients, test_fraction, seed)
    source = (
        f'{os.fspath(path)} ({len(read)} works read, {len(skipped)} without a cast list skipped; one client '
        f'per (work, role) with >= {min_examples} speeches: {len(clients)} of {num_roles} roles; '
        f'test_fraction={test_fraction}, seed={seed})'
    )
    return text_corpus.TextCorpus(name='shakespeare', train=train, test=test, source=source)
