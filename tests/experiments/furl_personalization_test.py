"""The FURL binary end to end on the generated default: four configurations, outputs, embedding analysis."""

import json
import os
import re

import numpy as np
import pytest
from absl import app
from absl import flags

from experiments import furl_personalization as binary
from fedpersonal.tasks import furl_embeddings
from fedpersonal.tasks import furl_personalization

FLAGS = flags.FLAGS


# A small generated run: 12 users, 3 rounds of 4 (one epoch), a tiny model.
SMALL = (
    '--synthetic_num_users=12',
    '--epochs=1',
    '--clients_per_round=4',
    '--max_chars=16',
    '--lstm_units=8',
    '--user_embedding_dim=4',
    '--mlp_units=8',
    '--rounds_per_eval=3',
)


def _run(argv):
    FLAGS.unparse_flags()
    FLAGS(['furl_personalization'] + argv)
    try:
        binary.main([])
    finally:
        FLAGS.unparse_flags()


def test_four_configurations_on_generated_data(tmp_path, capsys):
    out = str(tmp_path / 'furl')
    argv = [
        *SMALL,
        '--knn=2',
        '--simulation=per_client',  # The engine path: tests/simulation/furl_engine_test.py (compiles longer).
        f'--output_dir={out}',
    ]
    _run(argv)
    printed = capsys.readouterr().out
    for name in ('Global Server', 'Personalized Server', 'Global FL', 'Personalized FL'):
        assert name in printed
    with open(os.path.join(out, 'results.json')) as f:
        results = json.load(f)
    assert results['rounds'] == 3
    rows = {r['configuration']: r for r in results['rows']}
    assert set(rows) == set(furl_personalization.CONFIGURATIONS)
    assert 0 <= rows['personalized_fl']['accuracy'] <= 1 and 'default_state_accuracy' in rows['personalized_fl']
    assert rows['personalized_fl']['clients_with_trained_state'] > 0
    for name in ('global_fl', 'personalized_fl'):  # Early stopping's record (one evaluation, after round 3).
        assert (rows[name]['rounds'], rows[name]['best_round']) == (3, 3)
        assert 0 <= rows[name]['best_validation_accuracy'] <= 1  # A multi-class task: stopped on accuracy.
    for name in ('global_server', 'personalized_server'):  # Selected on the federated rows' metric, in epochs.
        assert (rows[name]['selected_by'], rows[name]['best_epoch'], rows[name]['epochs']) == ('val_accuracy', 1, 1)
        assert 0 <= rows[name]['best_validation_accuracy'] <= 1
    assert 0 <= results['embeddings']['knn_overlap'] <= 1
    assert os.path.getsize(os.path.join(out, 'user_embeddings.png')) > 1000
    assert os.path.exists(os.path.join(out, 'personalized_fl', 'client_states.sqlite'))

    # A rerun (e.g. after a kill in a later row) reads the finished rows and their user embeddings back.
    written = {name: os.path.getmtime(os.path.join(out, name, 'results.json')) for name in rows}
    os.remove(os.path.join(out, 'results.json'))
    _run(argv)
    with open(os.path.join(out, 'results.json')) as f:
        again = json.load(f)
    assert again['rows'] == results['rows'] and again['embeddings'] == results['embeddings']
    assert written == {name: os.path.getmtime(os.path.join(out, name, 'results.json')) for name in rows}

    # A server row finished by a version that selected on validation loss is not mixed into the table.
    old_row = os.path.join(out, 'personalized_server', 'results.json')
    with open(old_row, 'w') as f:
        json.dump({k: v for k, v in rows['personalized_server'].items() if k != 'selected_by'}, f)
    with pytest.raises(
        app.UsageError, match=re.escape(f'{old_row}: this personalized_server row was selected by another rule')
    ):
        _run(argv)


def test_knn_overlap_identical_and_unrelated():
    rng = np.random.default_rng(0)
    a = rng.normal(size=[50, 4])
    assert furl_embeddings.knn_overlap(a, a * 3.0, 5) == 1.0
    assert furl_embeddings.knn_overlap(a, rng.normal(size=[50, 4]), 5) < 0.4


def test_real_dataset_needs_a_data_dir(tmp_path):
    with pytest.raises(app.UsageError, match='needs --data_dir'):
        _run(['--dataset=assistments', f'--output_dir={tmp_path}'])
