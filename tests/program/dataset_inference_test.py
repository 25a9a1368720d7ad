"""`--data_dir` without `--dataset`: every config infers the dataset from the files there, or refuses.

Never generated data when a data_dir is given: the dataset is inferred (and recorded in the config) when exactly
one dataset of the binary matches the files, and otherwise a `ConfigError` names `--dataset` and its choices.
"""

import dataclasses
import logging
import os
import pathlib

import pytest
from absl import app
from absl import flags

from fedpersonal import errors
from fedpersonal.data import assistments
from fedpersonal.data import hpfl_movielens
from fedpersonal.data import image_datasets
from fedpersonal.data import movielens_files
from fedpersonal.data import movielens_likes
from fedpersonal.data import shakespeare
from fedpersonal.data import stackoverflow
from fedpersonal.program import config_flags
from fedpersonal.program import dataset_inference
from fedpersonal.tasks import feddva_config
from fedpersonal.tasks import furl_personalization_config
from fedpersonal.tasks import hpfl_user_modeling_config
from fedpersonal.tasks import movielens_mf_config
from fedpersonal.tasks import next_word_prediction_config

Feddva = feddva_config.FeddvaConfig
Furl = furl_personalization_config.FurlConfig
Hpfl = hpfl_user_modeling_config.HpflConfig
MovieLens = movielens_mf_config.MovieLensMFConfig
Nwp = next_word_prediction_config.NextWordPredictionConfig

# config class -> its generated default (what it trains on without --data_dir).
GENERATED = {
    Feddva: 'synthetic',
    Furl: 'synthetic_subreddit',
    Hpfl: 'synthetic',
    MovieLens: 'synthetic',
    Nwp: 'synthetic_text',
}

IDX = ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz', 't10k-images.idx3-ubyte', 't10k-labels.idx1-ubyte')
CIFAR = tuple(f'data_batch_{i}' for i in range(1, 6)) + ('test_batch',)
SHARED = pathlib.Path(__file__).resolve().parents[2].parent / 'shared' / 'data'


# The header lines of the CSV files that inference reads (every other file's content is not looked at).
HEADERS = {'record.csv': b'user_id,item_id,score\n1,2,1\n', 'item.csv': b'item_id,knowledge_code\n2,[1]\n'}


def _dir(tmp_path, *names, contents=None):
    directory = tmp_path / 'data'
    directory.mkdir()
    for name in names:
        (directory / name).write_bytes((contents or HEADERS).get(name, b'x'))
    return str(directory)


@pytest.mark.parametrize(
    'config_cls, files, expected',
    [
        (Feddva, CIFAR, 'cifar10'),
        (Furl, ('u.data', 'u.item', 'u.genre'), 'movielens_likes'),
        (Furl, ('record.csv', 'item.csv', 'dict_knowledge_code.json'), 'assistments'),
        (Hpfl, ('record.csv', 'item.csv'), 'assistments'),
        (Hpfl, ('u.data', 'u.item', 'u.user'), 'movielens'),
        (Nwp, ('shakespeare.txt.zip',), 'shakespeare'),
        (Nwp, ('shakespeare.txt',), 'shakespeare'),
        (Nwp, ('stackoverflow.sqlite',), 'stackoverflow'),
        (MovieLens, ('u.data', 'u.item'), 'movielens'),
        (MovieLens, ('ratings.dat', 'movies.dat'), 'movielens'),
    ],
    ids=lambda v: getattr(v, '__name__', str(v)),
)
def test_the_dataset_is_inferred_from_the_files_and_recorded(tmp_path, caplog, config_cls, files, expected):
    data_dir = _dir(tmp_path, *files)
    with caplog.at_level(logging.INFO, logger='absl'):
        config = config_cls(data_dir=data_dir)
    assert config.dataset == expected
    assert config.data_dir == data_dir
    assert any(f'--dataset inferred from --data_dir={data_dir}: {expected}' in r.getMessage() for r in caplog.records)


def test_a_data_file_is_recognised_by_its_name_or_content(tmp_path):
    (tmp_path / 'shakespeare.txt').write_text('hamlet@0\tHAMLET\tWords.\n')
    assert Nwp(data_dir=str(tmp_path / 'shakespeare.txt')).dataset == 'shakespeare'
    (tmp_path / 'so.db').write_bytes(b'SQLite format 3\x00' + bytes(100))
    assert Nwp(data_dir=str(tmp_path / 'so.db')).dataset == 'stackoverflow'
    (tmp_path / 'notes.txt').write_text('hello')
    with pytest.raises(errors.ConfigError, match='notes.txt is a file. Pass --dataset'):
        Nwp(data_dir=str(tmp_path / 'notes.txt'))


@pytest.mark.parametrize('config_cls', list(GENERATED), ids=lambda c: c.__name__)
@pytest.mark.parametrize('contents', [(), ('notes.txt', 'u.genre')], ids=['empty', 'unknown'])
def test_a_directory_of_no_dataset_is_an_error_naming_the_dataset_flag(tmp_path, config_cls, contents):
    data_dir = _dir(tmp_path, *contents)
    with pytest.raises(errors.ConfigError) as raised:
        config_cls(data_dir=data_dir)
    message = str(raised.value)
    assert '--dataset' in message and f'--data_dir={data_dir}' in message
    for name in _layouts(config_cls):
        assert repr(name) in message  # The valid choices.
    assert ('is empty' in message) if not contents else ('notes.txt' in message)


def test_a_missing_directory_is_an_error(tmp_path):
    with pytest.raises(errors.ConfigError, match='does not exist.*Pass --dataset'):
        Furl(data_dir=str(tmp_path / 'nowhere'))


def _layouts(config_cls):
    module = {
        Feddva: feddva_config,
        Furl: furl_personalization_config,
        Hpfl: hpfl_user_modeling_config,
        MovieLens: movielens_mf_config,
        Nwp: next_word_prediction_config,
    }[config_cls]
    return module.DATA_LAYOUTS


@pytest.mark.parametrize(
    'config_cls, files, candidates',
    [
        (Feddva, IDX, ('mnist', 'fashion_mnist')),  # The same IDX file names.
        (Furl, ('u.data', 'u.item', 'record.csv', 'item.csv'), ('movielens_likes', 'assistments')),
        (Hpfl, ('u.data', 'u.item', 'u.user', 'record.csv', 'item.csv'), ('assistments', 'movielens')),
    ],
    ids=lambda v: getattr(v, '__name__', ''),
)
def test_an_ambiguous_directory_is_an_error(tmp_path, config_cls, files, candidates):
    with pytest.raises(errors.ConfigError) as raised:
        config_cls(data_dir=_dir(tmp_path, *files))
    message = str(raised.value)
    assert '--dataset' in message and 'several datasets' in message
    for name in candidates:
        assert name in message


def test_hpfl_movielens_needs_the_user_file(tmp_path):
    with pytest.raises(errors.ConfigError, match=r'movielens: u\.data, u\.item and u\.user'):
        Hpfl(data_dir=_dir(tmp_path, 'u.data', 'u.item'))


@pytest.mark.parametrize('config_cls', list(GENERATED), ids=lambda c: c.__name__)
def test_without_data_dir_the_generated_default_is_unchanged(config_cls):
    assert config_cls().dataset == GENERATED[config_cls]
    assert config_cls(dataset=dataset_inference.AUTO).dataset == GENERATED[config_cls]
    assert config_cls(data_dir=None).dataset == GENERATED[config_cls]


@pytest.mark.parametrize('config_cls', list(GENERATED), ids=lambda c: c.__name__)
def test_the_generated_dataset_with_a_data_dir_is_contradictory(tmp_path, config_cls):
    generated = GENERATED[config_cls]
    with pytest.raises(errors.ConfigError, match=f'--dataset={generated} .*contradicts --data_dir='):
        config_cls(dataset=generated, data_dir=str(tmp_path))


OTHER_RELEASE = {  # The names of the a0910 files, the columns of another release, no timestamps.
    'record.csv': b'order_id,assignment_id,user_id,problem_id,correct\n1,2,3,4,1\n',
    'item.csv': b'problem_id,skill_name\n4,Addition\n',
}


@pytest.mark.parametrize('config_cls', [Furl, Hpfl], ids=lambda c: c.__name__)
def test_the_file_names_of_a_dataset_with_other_columns_are_refused_naming_the_columns(tmp_path, config_cls):
    data_dir = _dir(tmp_path, 'record.csv', 'item.csv', contents=OTHER_RELEASE)
    with pytest.raises(dataset_inference.DataLayoutError) as raised:
        config_cls(data_dir=data_dir)
    message = str(raised.value)
    assert isinstance(raised.value, errors.DataError)  # A usage error (exit status 2), not a bug.
    assert f'--data_dir={data_dir}' in message and '--dataset=assistments' in message
    assert "record.csv has columns 'order_id,assignment_id,user_id,problem_id,correct'" in message
    assert "expected 'user_id,item_id,score'" in message
    assert "item.csv has columns 'problem_id,skill_name', expected 'item_id,knowledge_code'" in message
    assert raised.value.columns == {
        'record.csv': ('order_id', 'assignment_id', 'user_id', 'problem_id', 'correct'),
        'item.csv': ('problem_id', 'skill_name'),
    }


def test_one_file_with_other_columns_is_enough_to_refuse_and_only_it_is_named(tmp_path):
    contents = {**HEADERS, 'item.csv': '\ufeffitem_id,skills\r\n1,2\n'.encode()}
    with pytest.raises(dataset_inference.DataLayoutError) as raised:
        Hpfl(data_dir=_dir(tmp_path, 'record.csv', 'item.csv', contents=contents))
    assert "item.csv has columns 'item_id,skills', expected 'item_id,knowledge_code'" in str(raised.value)
    assert 'record.csv has' not in str(raised.value)
    empty = tmp_path / 'empty'
    empty.mkdir()
    (empty / 'record.csv').write_bytes(HEADERS['record.csv'])
    (empty / 'item.csv').write_bytes(b'\xff\xfe\n')  # Not UTF-8.
    with pytest.raises(dataset_inference.DataLayoutError, match='item.csv has no readable header line'):
        Hpfl(data_dir=str(empty))


def test_another_dataset_in_the_directory_is_still_inferred_beside_foreign_csv_files(tmp_path):
    files = ('u.data', 'u.item', 'record.csv', 'item.csv')
    assert Furl(data_dir=_dir(tmp_path, *files, contents=OTHER_RELEASE)).dataset == 'movielens_likes'


def test_an_explicit_dataset_is_kept(tmp_path):
    data_dir = _dir(tmp_path, 'u.data', 'u.item')  # MovieLens files, but the user says ASSISTments: the loader
    assert Furl(dataset='assistments', data_dir=data_dir).dataset == 'assistments'  # will report what is missing.


@pytest.mark.skipif(not SHARED.is_dir(), reason='no ../shared/data')
def test_the_shared_real_datasets_are_recognised():
    assert dataset_inference.ASSISTMENTS.found_columns(str(SHARED / 'assist-a0910')) == {
        'record.csv': ('user_id', 'item_id', 'score'),
        'item.csv': ('item_id', 'knowledge_code'),
    }
    assert Furl(data_dir=str(SHARED / 'assist-a0910')).dataset == 'assistments'
    assert Hpfl(data_dir=str(SHARED / 'assist-a0910')).dataset == 'assistments'
    assert Nwp(data_dir=str(SHARED / 'shakespeare')).dataset == 'shakespeare'
    with pytest.raises(errors.ConfigError, match='mnist, fashion_mnist'):
        Feddva(data_dir=str(SHARED / 'mnist'))
    assert Feddva(dataset='mnist', data_dir=str(SHARED / 'mnist')).dataset == 'mnist'


def test_the_layouts_are_the_files_the_loaders_read(tmp_path):
    i = dataset_inference
    assert i.ASSISTMENTS.files == ((assistments._RECORD_FILE,), (assistments._ITEM_FILE,))
    assert i.ASSISTMENTS.columns == (
        (assistments._RECORD_FILE, tuple(assistments._RECORD_HEADER.split(','))),
        (assistments._ITEM_FILE, tuple(assistments._ITEM_HEADER.split(','))),
    )
    assert i.MOVIELENS_LIKES.files == ((movielens_files._FILE_100K,), (movielens_likes._ITEM_FILE,))
    assert i.MOVIELENS_USERS.files == i.MOVIELENS_LIKES.files + ((hpfl_movielens._USER_FILE,),)
    assert i.MOVIELENS_RATINGS.files == ((movielens_files._FILE_100K, movielens_files._FILE_1M),)
    assert i.SHAKESPEARE.files == (shakespeare._FILE_NAMES,)
    assert i.STACKOVERFLOW.files == ((stackoverflow.SQLITE_FILE,),)
    assert i.FASHION_MNIST.files == i.MNIST.files
    for names, (split, kind) in zip(
        i.IDX_FILES, [('train', 'images'), ('train', 'labels'), ('t10k', 'images'), ('t10k', 'labels')], strict=True
    ):
        for name in names:  # Every spelling inference accepts is one the IDX loader finds.
            directory = tmp_path / name
            directory.mkdir()
            (directory / name).write_bytes(b'')
            assert image_datasets._find(str(directory), split, kind) == os.path.join(str(directory), name)
    assert i.CIFAR10.files == tuple((name,) for name in CIFAR)


def test_flags_with_only_data_dir_build_a_config_naming_the_inferred_dataset(tmp_path):
    flag_values = flags.FlagValues()
    config_flags.define_flags(Furl, flag_values=flag_values)
    data_dir = _dir(tmp_path, 'record.csv', 'item.csv')
    flag_values(['furl', f'--data_dir={data_dir}'])
    config = config_flags.config_from_flags(Furl, flag_values=flag_values)
    assert dataclasses.asdict(config)['dataset'] == 'assistments'  # What config.json records.
    flag_values.unparse_flags()
    flag_values(['furl'])
    assert config_flags.config_from_flags(Furl, flag_values=flag_values).dataset == 'synthetic_subreddit'


def test_the_binary_refuses_an_unrecognised_data_dir_before_training(tmp_path):
    from experiments import furl_personalization as binary  # pylint: disable=g-import-not-at-top

    data_dir = _dir(tmp_path, 'u.data')  # MovieLens likes also needs u.item.
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['furl_personalization', f'--data_dir={data_dir}', f'--output_dir={tmp_path / "out"}'])
    try:
        with pytest.raises(app.UsageError, match=r'without --dataset.*u\.data.*Pass --dataset'):
            binary.main([])
    finally:
        flags.FLAGS.unparse_flags()
    assert not (tmp_path / 'out').exists()  # Nothing ran.
