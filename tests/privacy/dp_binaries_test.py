"""The MovieLens and FURL binaries with --dp_noise_multiplier: epsilon per round in metrics.csv, and in results."""

import csv
import json
import os

import pytest
from absl import app
from absl import flags

from experiments import furl_personalization as furl_binary
from experiments import movielens_mf as movielens_binary
from fedpersonal.privacy import dp
from tests.experiments import furl_personalization_test as furl_test

FLAGS = flags.FLAGS


def _run(binary, argv):
    FLAGS.unparse_flags()
    FLAGS(['binary'] + argv)
    try:
        binary.main([])
    finally:
        FLAGS.unparse_flags()


def _metrics(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_fedrecon_with_dp_reports_epsilon_per_round_and_at_the_end(tmp_path, capsys):
    out = str(tmp_path / 'ml')
    _run(
        movielens_binary,
        [
            '--synthetic_num_users=40',
            '--synthetic_num_items=30',
            '--clients_per_round=4',
            '--eval_clients=4',
            '--rounds_per_eval=3',
            '--batch_size=5',
            '--total_rounds=3',
            '--configurations=fedrecon',
            '--dp_noise_multiplier=1.0',
            '--dp_clip=0.5',
            '--dp_target_delta=1e-4',
            f'--output_dir={out}',
        ],
    )
    printed = capsys.readouterr().out
    with open(os.path.join(out, 'results.json')) as f:
        (row,) = json.load(f)['rows']
    privacy = row['privacy']
    num_clients = privacy['num_clients']
    assert 20 <= num_clients < 40  # The training users only (80% of the generated ones).
    expected = dp.epsilon(
        noise_multiplier=1.0, num_clients=num_clients, clients_per_round=4, rounds=3, target_delta=1e-4
    )
    # The run's epsilon: 3 rounds' RDP as 3 * one round's, the function's as the accountant's sum of 3: float64 in
    # another order (relative ~1e-16), within approx's default.
    assert privacy['epsilon'] == pytest.approx(expected)
    literature = dp.epsilon_add_remove_poisson(
        noise_multiplier=1.0, num_clients=num_clients, clients_per_round=4, rounds=3, target_delta=1e-4
    )
    assert privacy['epsilon_add_remove_poisson'] == pytest.approx(literature) and literature < expected
    assert (privacy['delta'], privacy['rounds'], privacy['clip'], privacy['noise_multiplier']) == (1e-4, 3, 0.5, 1.0)
    assert privacy['neighbouring'] == 'replace-one user' and privacy['client_weighting'] == 'uniform'
    assert 'seeded by the run seed 0' in privacy['noise']  # A fixed clip: reproducible noise.
    rows = _metrics(os.path.join(out, 'fedrecon', 'metrics.csv'))
    epsilons = [float(r['privacy/epsilon']) for r in rows]
    assert epsilons == sorted(epsilons) and len(set(epsilons)) == 3
    assert epsilons[-1] == pytest.approx(expected)  # As above, through the CSV's text.
    assert [float(r['privacy/clip']) for r in rows] == [0.5] * 3
    assert 'DP: (' in printed and 'replace-one user' in printed and 'add/remove-one, Poisson' in printed


def test_furl_with_adaptive_dp_on_its_federated_rows(tmp_path, capsys):
    out = str(tmp_path / 'furl')
    _run(
        furl_binary,
        [
            *furl_test.SMALL,
            '--configurations=global_fl,personalized_fl',
            '--dp_noise_multiplier=0.3',
            '--dp_clipped_count_stddev=0.5',
            '--state_store=memory',
            f'--output_dir={out}',
        ],
    )
    with open(os.path.join(out, 'results.json')) as f:
        results = json.load(f)
    for row in results['rows']:
        privacy = row['privacy']
        assert privacy['clip'] == 'adaptive' and privacy['rounds'] == 3 and privacy['epsilon'] > 0
        assert 'unseeded' in privacy['noise']
        assert 0 < privacy['epsilon_add_remove_poisson'] < privacy['epsilon']
        assert privacy['delta'] == dp.default_target_delta(privacy['num_clients'])  # The same function, exactly.
        rows = _metrics(os.path.join(out, row['configuration'], 'metrics.csv'))
        clips = [float(r['privacy/clip']) for r in rows]
        assert len(clips) == 3 and clips[0] != 0.1 and all(c > 0 for c in clips)  # Adapted from the initial 0.1.
        # The same epsilon, through the CSV's text and the JSON's (float64 either way; approx's default for the text).
        assert float(rows[-1]['privacy/epsilon']) == pytest.approx(privacy['epsilon'])
    assert 'Personalized FL: DP: (' in capsys.readouterr().out


def test_binaries_refuse_dp_for_server_rows(tmp_path):
    with pytest.raises(app.UsageError, match=r'dp_noise_multiplier .*server'):
        _run(furl_binary, ['--dp_noise_multiplier=1', '--dp_clip=1', f'--output_dir={tmp_path}'])
    with pytest.raises(app.UsageError, match='dp_clipped_count_stddev'):
        _run(furl_binary, ['--dp_noise_multiplier=1', '--configurations=global_fl', f'--output_dir={tmp_path}'])
    assert not os.listdir(tmp_path)
