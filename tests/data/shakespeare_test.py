"""Tests for fedpersonal.data.shakespeare (Moby Shakespeare -> one client per (play, role), one example per speech)."""

import os
import pathlib
import zipfile

import pytest

from fedpersonal.data import shakespeare
from fedpersonal.data import text_corpus
from fedpersonal.data.shakespeare import ShakespeareFormatError

_REAL_ZIP = pathlib.Path(os.environ.get('FEDPERSONAL_SHAKESPEARE', '/work/shared/data/shakespeare/shakespeare.txt.zip'))

# A small file in the Moby layout, exercising every construct of the real file. Lines 1-2 (and 14) belong to a poem
# interleaved with the play (works need not be contiguous).
_LINES = [
    'poem@0\t\tA POEM',
    'poem@9\t',
    'play@0\t\tTHE PLAY',
    'play@10\t',
    'play@11\t\tDRAMATIS PERSONAE',
    'play@30\t',
    'play@31\tALPHA\ta hero. (ALPHA:)',
    'play@50\tBETA\t|',
    'play@55\t\t|  twins.',
    'play@60\tGAMMA\t|',
    'play@70\tSCENE\tSomewhere.',
    'play@80\t',
    'play@90\tACT I',
    'poem@10\tFROM fairest creatures we desire increase,',  # Line 14: verse in the SPEAKER column.
    'play@100\t',
    'play@110\tSCENE I\tA room.',
    'play@120\t',
    'play@130\t\t[Enter ALPHA and BETA]',
    'play@140\t',
    "play@150\tALPHA\t'Tis cold; who's there?",  # Line 20: first speech.
    'play@160\t\tSpeak, I say!',
    'play@170\t',
    'play@180\tBETA\t[Aside]  A friend,',
    "play@190\t\tand o'er\tthe hill.",  # A tab inside the text.
    'play@200\t',
    'play@210\tDON',  # A name over two lines.
    'play@220\tOF ARAGON\tWell met.',
    'play@230\t',
    'play@240\tBETA\t|',  # A joint (braced) speech of BETA and GAMMA.
    'play@250\t\t|\tWe agree.',
    'play@260\tGAMMA\t|',
    'play@270\t',
    'play@280\tGAMMA: Hail, friends!',  # Text run into the SPEAKER field.
    'play@290\t',
    'play@300\tALPHA\tGo on. [Exit BETA and',  # A stage direction over two lines.
    'play@310\t\tGAMMA]',
    'play@320\t',
    'play@330\tALPHA\t[Exit]',  # Nothing but a stage direction: no example.
    'play@340\t',
    'play@360\tALPHA\tAgain.',  # Out of offset order in the file; follows the ACT II heading.
    'play@350\tACT II',
    'play@370\t',
    'play@380\tBETA',
    'play@390\t\tI start below my name.',
    'chat@0\tANN\tHello there.',  # A work without a cast list.
    'chat@10\t',
    'chat@11\tBOB\tHi, Ann.',
]
_PLAY_CLIENTS = {
    'play_ALPHA': ["'tis cold ; who's there ? speak , i say !", 'go on .', 'again .'],
    'play_BETA': ["a friend , and o'er the hill .", 'we agree .', 'i start below my name .'],
    'play_DON_OF_ARAGON': ['well met .'],
    'play_GAMMA': ['we agree .', 'hail , friends !'],
}


def _write(tmp_path, lines=_LINES, name='shakespeare.txt', data=None):
    path = tmp_path / name
    path.write_bytes(data if data is not None else ('\n'.join(lines) + '\n').encode('utf-8'))
    return str(path)


def _all(corpus):
    return {**corpus.train, **corpus.test}


def test_parses_every_construct(tmp_path):
    corpus = shakespeare.load_shakespeare(_write(tmp_path), min_examples=1, test_fraction=0.0)
    assert corpus.name == 'shakespeare' and corpus.test == {}
    assert corpus.train == _PLAY_CLIENTS  # The poem and the cast-less 'chat' work are skipped.
    assert list(corpus.train) == list(_PLAY_CLIENTS)  # Clients in order of their first speech.
    assert '1 works read, 2 without a cast list skipped' in corpus.source


def test_read_speeches_reports_lines_and_offsets(tmp_path):
    speeches = shakespeare.read_speeches(_write(tmp_path))
    assert speeches[0] == shakespeare.Speech('play', 'ALPHA', 150, 20, "'Tis cold; who's there? Speak, I say!")
    assert [(s.speaker, s.offset) for s in speeches] == [
        ('ALPHA', 150),
        ('BETA', 180),
        ('DON OF ARAGON', 210),
        ('BETA', 240),
        ('GAMMA', 240),
        ('GAMMA', 280),
        ('ALPHA', 300),
        ('ALPHA', 360),
        ('BETA', 380),
    ]


def test_plays_only_false_reads_works_without_cast_list(tmp_path):
    corpus = shakespeare.load_shakespeare(_write(tmp_path), min_examples=1, test_fraction=0.0, plays_only=False)
    assert corpus.train == {**_PLAY_CLIENTS, 'chat_ANN': ['hello there .'], 'chat_BOB': ['hi , ann .']}


def test_min_examples_and_client_split(tmp_path):
    path = _write(tmp_path)
    corpus = shakespeare.load_shakespeare(path, min_examples=2, test_fraction=0.34, seed=1)
    assert _all(corpus) == {c: e for c, e in _PLAY_CLIENTS.items() if len(e) >= 2}
    assert len(corpus.train) == 2 and len(corpus.test) == 1
    assert shakespeare.load_shakespeare(path, min_examples=2, test_fraction=0.34, seed=1) == corpus
    assert set(shakespeare.load_shakespeare(path, min_examples=3, test_fraction=0.0).train) == {
        'play_ALPHA',
        'play_BETA',
    }
    with pytest.raises(ValueError, match='no role has at least min_examples=4'):
        shakespeare.load_shakespeare(path, min_examples=4)
    with pytest.raises(ValueError, match='min_examples'):
        shakespeare.load_shakespeare(path, min_examples=0)


def test_zip_txt_and_directory_inputs_agree(tmp_path):
    txt = _write(tmp_path)
    expected = shakespeare.load_shakespeare(txt, min_examples=1, test_fraction=0.0).train
    zip_dir = tmp_path / 'zipped'
    zip_dir.mkdir()
    with zipfile.ZipFile(zip_dir / 'shakespeare.txt.zip', 'w', compression=zipfile.ZIP_DEFLATED) as archive:
        archive.write(txt, 'shakespeare.txt')
    for path in (zip_dir / 'shakespeare.txt.zip', zip_dir, tmp_path):
        assert shakespeare.load_shakespeare(str(path), min_examples=1, test_fraction=0.0).train == expected


def test_crlf_line_endings(tmp_path):
    path = _write(tmp_path, data=('\r\n'.join(_LINES) + '\r\n').encode('utf-8'))
    assert shakespeare.load_shakespeare(path, min_examples=1, test_fraction=0.0).train == _PLAY_CLIENTS


def test_client_id_sanitizes():
    assert shakespeare.client_id('hamlet', 'HAMLET') == 'hamlet_HAMLET'
    assert shakespeare.client_id('timonofathens', "Varro's Servants") == 'timonofathens_Varro_s_Servants'
    assert shakespeare.client_id('merrywivesofwindsor', '&C') == 'merrywivesofwindsor_C'


@pytest.mark.parametrize(
    'bad_line, message',
    [
        ('play@400', 'line 21: no tab'),
        ('play400\tX\ty', "line 21: expected work@offset .* got 'play400'"),
        ('play@-3\tX\ty', 'line 21: expected work@offset'),
        ('@5\tX\ty', 'line 21: expected work@offset'),
        ('play@150\tX\ty', r"line 21: duplicate offset 'play@150' \(first on line 20\)"),
        ('', 'line 21: empty line'),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line, message):
    lines = list(_LINES)
    lines.insert(20, bad_line)
    path = _write(tmp_path, lines)
    with pytest.raises(ShakespeareFormatError, match=message) as info:
        shakespeare.load_shakespeare(path, min_examples=1)
    assert str(info.value).startswith(path) and info.value.line == 21 and info.value.path == path


def test_malformed_line_in_zip_names_archive_member_and_line(tmp_path):
    lines = list(_LINES)
    lines.insert(4, 'no tab here')
    archive_path = tmp_path / 'shakespeare.txt.zip'
    with zipfile.ZipFile(archive_path, 'w') as archive:
        archive.writestr('shakespeare.txt', '\n'.join(lines))
    with pytest.raises(ShakespeareFormatError, match=r'shakespeare.txt.zip \(member shakespeare.txt\) line 5: no tab'):
        shakespeare.load_shakespeare(str(archive_path))


def test_invalid_utf8_names_line(tmp_path):
    data = ('\n'.join(_LINES[:6]) + '\n').encode() + b'play@31\tALPHA\ta h\xffro.\n'
    with pytest.raises(ShakespeareFormatError, match='line 7: not valid UTF-8') as info:
        shakespeare.load_shakespeare(_write(tmp_path, data=data))
    assert info.value.line == 7


def test_cast_list_without_heading(tmp_path):
    path = _write(tmp_path, ['x@0\t\tDRAMATIS PERSONAE', 'x@20\tANN\ta lady.'])
    with pytest.raises(ShakespeareFormatError, match="line 1: the cast list of 'x' is not followed by an ACT"):
        shakespeare.load_shakespeare(path)


def test_missing_or_ambiguous_inputs(tmp_path):
    with pytest.raises(ShakespeareFormatError, match='file not found'):
        shakespeare.load_shakespeare(str(tmp_path / 'nope.txt'))
    with pytest.raises(ShakespeareFormatError, match='directory has neither'):
        shakespeare.load_shakespeare(str(tmp_path))
    archive_path = tmp_path / 'two.zip'
    with zipfile.ZipFile(archive_path, 'w') as archive:
        archive.writestr('a.txt', 'x@0\tA\tb')
        archive.writestr('b.txt', 'x@0\tA\tb')
    with pytest.raises(ShakespeareFormatError, match='expected a zip holding one text file'):
        shakespeare.load_shakespeare(str(archive_path))
    with pytest.raises(ShakespeareFormatError, match='no lines'):
        shakespeare.load_shakespeare(_write(tmp_path, data=b'\n\n'))


@pytest.mark.skipif(not _REAL_ZIP.is_file(), reason=f'{_REAL_ZIP} not present')
def test_real_file_statistics():
    corpus = shakespeare.load_shakespeare(str(_REAL_ZIP))
    stats = text_corpus.corpus_statistics(corpus)
    assert '37 works read, 7 without a cast list skipped' in corpus.source
    assert '413 of 1347 roles' in corpus.source
    assert (stats['train']['clients'], stats['test']['clients']) == (330, 83)
    assert stats['train']['examples'] + stats['test']['examples'] == 25686
    assert stats['train']['tokens'] + stats['test']['tokens'] == 775235
    assert stats['train']['examples_per_client']['min'] >= 20
    assert 0.83 < stats['train_coverage'][1000] < 0.86 and 0.94 < stats['train_coverage'][5000] < 0.96
    clients = _all(corpus)
    assert clients['hamlet_HAMLET'][0] == 'a little more than kin , and less than kind .'
    assert len(clients['hamlet_HAMLET']) == 359
    assert {
        'comedyoferrors_ANTIPHOLUS_OF_EPHESUS',
        'comedyoferrors_ANTIPHOLUS_OF_SYRACUSE',
        'muchadoaboutnothing_DON_PEDRO',
    } <= clients.keys()  # Names over two lines.
    assert not any(c.startswith(('sonnets', 'glossary', 'README')) for c in clients)
    assert not any('[' in e or ']' in e or '|' in e for examples in clients.values() for e in examples)
