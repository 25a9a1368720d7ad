"""The binaries on a user's own CSV tables (`--dataset=csv --data_path=FILE`, docs/DATA.md): tiny end-to-end runs
labelled with the data's name, and the usage errors that name the flag."""

import json
import os

import numpy as np
import pytest
from absl import app
from absl import flags

from experiments import furl_personalization as furl_binary
from experiments import hpfl_user_modeling as hpfl_binary
from experiments import movielens_mf as mf_binary

FLAGS = flags.FLAGS


def _run(binary, argv):
    FLAGS.unparse_flags()
    FLAGS(['binary'] + argv)
    try:
        binary.main([])
    finally:
        FLAGS.unparse_flags()


def _responses(path, *, silos=True, num_users=12, num_questions=10, per_user=8):
    rng = np.random.default_rng(0)
    rows = ['user,question,correct,skills,timestamp' + (',silo' if silos else '')]
    for u in range(num_users):
        for t, q in enumerate(rng.choice(num_questions, size=per_user, replace=False)):
            silo = f',school_{u % 3}' if silos else ''
            rows.append(f'student{u},q{q},{int(rng.random() < 0.3 + 0.05 * q)},{q % 4};{(q + 1) % 4},{t}{silo}')
    path.write_text('\n'.join(rows) + '\n')
    return str(path)


def _ratings(path, *, num_users=30, num_items=20, per_user=10):
    rng = np.random.default_rng(1)
    rows = ['user,item,rating']
    for u in range(num_users):
        rows += [f'{u},{i},{rng.integers(1, 6)}' for i in rng.choice(num_items, size=per_user, replace=False)]
    path.write_text('\n'.join(rows) + '\n')
    return str(path)


def test_hpfl_on_a_responses_table_with_a_silo_column(tmp_path, capsys):
    out = str(tmp_path / 'hpfl')
    data_path = _responses(tmp_path / 'my_school.csv')
    _run(
        hpfl_binary,
        [
            '--dataset=csv',
            f'--data_path={data_path}',
            '--assist_grouping=column',
            '--accuracy_threshold=none',
            '--methods=fedavg',
            '--total_rounds=2',
            '--hidden_dim=4',
            f'--output_dir={out}',
        ],
    )
    assert 'Dataset: csv:my_school' in capsys.readouterr().out
    with open(os.path.join(out, 'results.json')) as f:
        results = json.load(f)
    assert results['dataset'] == 'csv:my_school'
    assert results['statistics']['num_clients'] == 3 and results['statistics']['num_users'] == 12
    assert 0.0 <= results['rows'][0]['accuracy'] <= 1.0
    with open(os.path.join(out, 'config.json')) as f:
        threshold = json.load(f)['accuracy_threshold']
    assert 0.5 <= threshold < 1.0  # Derived from the training labels and recorded.


def test_movielens_mf_on_a_ratings_table(tmp_path, capsys):
    out = str(tmp_path / 'mf')
    data_path = _ratings(tmp_path / 'shop.csv')
    _run(
        mf_binary,
        [
            f'--data_path={data_path}',  # Selects --dataset=csv.
            '--split_order=shuffle',
            '--configurations=fedrecon',
            '--total_rounds=2',
            '--clients_per_round=4',
            '--eval_clients=3',
            '--rounds_per_eval=1',
            '--num_latent_factors=4',
            f'--output_dir={out}',
        ],
    )
    assert 'Dataset: csv:shop' in capsys.readouterr().out
    with open(os.path.join(out, 'results.json')) as f:
        results = json.load(f)
    assert results['dataset'].startswith('csv:shop ')
    assert results['statistics']['num_users'] == 30 and results['statistics']['num_ratings'] == 300
    assert np.isfinite(results['rows'][0]['rmse'])


def test_furl_reads_a_responses_table_as_its_task_data(tmp_path):
    # The FURL binary's data step (the rest of the run is the one of every dataset: tests/experiments/furl_*).
    from fedpersonal.tasks import furl_personalization  # pylint: disable=g-import-not-at-top

    data_path = _responses(tmp_path / 'answers.csv', silos=False)
    config = furl_personalization.FurlConfig(data_path=data_path, split_order='shuffle', output_dir=str(tmp_path))
    data = furl_personalization.load_data(config)
    assert data.name == 'csv:answers' and data.description.startswith('csv:answers ')
    assert (data.num_users, data.num_items, data.num_features, data.num_classes) == (12, 10, 4, 2)
    assert sum(data.num_examples(s) for s in ('train', 'eval', 'test')) == 12 * 8


@pytest.mark.parametrize('binary', [mf_binary, hpfl_binary, furl_binary])
def test_csv_without_a_data_path_names_the_flag(tmp_path, binary):
    with pytest.raises(app.UsageError, match='--data_path'):
        _run(binary, ['--dataset=csv', f'--output_dir={tmp_path}'])
    with pytest.raises(app.UsageError, match='--data_path'):
        _run(binary, ['--dataset=csv', f'--data_path={tmp_path / "missing.csv"}', f'--output_dir={tmp_path}'])


def test_timestamp_order_of_a_file_without_timestamps_names_the_flag(tmp_path):
    data_path = _ratings(tmp_path / 'r.csv')
    with pytest.raises(app.UsageError, match='--split_order'):
        _run(mf_binary, [f'--data_path={data_path}', '--split_order=timestamp', f'--output_dir={tmp_path / "o"}'])


def test_a_malformed_table_is_a_usage_error_naming_file_line_and_field(tmp_path):
    data_path = tmp_path / 'bad.csv'
    data_path.write_text('user,question,correct,skills\na,q,1,1\na,r,0.5,1\n')
    with pytest.raises(app.UsageError, match=r"bad\.csv line 3 field 'correct'.*--binarize_threshold"):
        _run(hpfl_binary, [f'--data_path={data_path}', '--assist_grouping=random', f'--output_dir={tmp_path / "o"}'])


def test_furl_movielens_likes_takes_a_timestamp_or_shuffled_split_order(tmp_path):
    from fedpersonal import errors  # pylint: disable=g-import-not-at-top
    from fedpersonal.tasks import furl_personalization  # pylint: disable=g-import-not-at-top

    for name in ('u.data', 'u.item'):
        (tmp_path / name).write_text('')
    make = lambda order: furl_personalization.FurlConfig(
        dataset='movielens_likes', data_dir=str(tmp_path), split_order=order, output_dir=str(tmp_path / 'o')
    )
    assert make('shuffle').split_order == 'shuffle' and make(None).split_order is None
    with pytest.raises(errors.ConfigError, match="--split_order=file: --dataset=movielens_likes's file is not in time"):
        make('file')
    with pytest.raises(errors.ConfigError, match='--split_order applies to --dataset=csv only'):
        furl_personalization.FurlConfig(
            dataset='synthetic_subreddit', split_order='shuffle', output_dir=str(tmp_path / 'o')
        )
