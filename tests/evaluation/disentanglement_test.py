"""Linear probes, probe report, manifold grid and projection plots."""

import numpy as np
import pytest

from fedpersonal.evaluation import disentanglement


def synthetic_codes(n, seed):
    """c encodes the client (clusters), z encodes the label; neither carries the other."""
    rng = np.random.default_rng(seed)
    client = rng.integers(0, 4, size=n)
    label = rng.integers(0, 3, size=n)
    c = np.eye(4)[client] * 3 + rng.normal(0, 0.5, size=[n, 4])
    z = np.eye(3)[label] * 3 + rng.normal(0, 0.5, size=[n, 3])
    return {'z': z, 'c': c, 'client': client, 'label': label, 'mark': client % 2}


def test_probes_find_what_each_representation_carries():
    train, test = synthetic_codes(400, 0), synthetic_codes(200, 1)
    report = disentanglement.probe_report(train, test)
    assert report['probe_client_from_c'] > 0.95 and report['probe_client_from_z'] < 0.45
    assert report['probe_label_from_z'] > 0.95 and report['probe_label_from_c'] < 0.55
    assert report['probe_mark_from_c'] > 0.95
    assert 0.2 < report['chance_client'] < 0.35
    constant = dict(train, mark=np.zeros_like(train['mark']))
    assert 'probe_mark_from_c' not in disentanglement.probe_report(constant, test)
    with pytest.raises(ValueError, match='same number of rows'):
        disentanglement.linear_probe_accuracy(train['z'], train['label'][:5], test['z'], test['label'])


def test_figures(tmp_path):
    rng = np.random.default_rng(0)
    grid = disentanglement.plot_manifold_grids(
        [('a', rng.uniform(size=[3, 4, 8, 8, 1])), ('b', rng.uniform(size=[3, 4, 8, 8, 1]))],
        str(tmp_path / 'grid.png'),
        title='t',
    )
    codes = synthetic_codes(60, 2)
    projections = disentanglement.plot_projections(
        codes['z'],
        codes['c'],
        codes['client'],
        str(tmp_path / 'proj.png'),
        method='pca',
        also_by=[('label', codes['label'])],
    )
    for path in (grid, projections):
        with open(path, 'rb') as f:
            assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    xy = disentanglement.project_2d(codes['c'], 'pca')
    assert xy.shape == (60, 2)
    # PCA keeps the direction of largest variance first.
    assert np.var(xy[:, 0]) >= np.var(xy[:, 1])
