"""Every figure the tasks write: labelled axes, a title, and legends that cover no panel (issue 41).

Each plotting function is run on small generated data; the figures are caught as they are saved and checked with
matplotlib's renderer (the window extents of the legends against those of the panels, labels included).
"""

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fedpersonal import program
from fedpersonal.data import synthetic_user_modeling
from fedpersonal.data import user_modeling
from fedpersonal.evaluation import disentanglement
from fedpersonal.tasks import feddva_analysis
from fedpersonal.tasks import furl_embeddings
from fedpersonal.tasks import hpfl_analysis

_RNG = np.random.default_rng(0)


def _curves():
    return {
        name: [{'round': r, 'eval/loss': 0.7 - 0.01 * r + 0.01 * i, 'eval/auc': 0.6 + 0.01 * r} for r in range(1, 20)]
        for i, name in enumerate(['Global FL', 'Personalized FL'])
    }


def _learning_curves(path):  # FURL's: long reference labels beside the last panel.
    references = {
        'Global Server (selected epoch)': {'eval/loss': 0.6, 'eval/auc': 0.68},
        'Personalized Server (selected epoch)': {'eval/loss': 0.56, 'eval/auc': 0.77},
    }
    program.plot_curves(_curves(), ['eval/loss', 'eval/accuracy', 'eval/auc'], path, references=references)


def _private_components(path):
    silo = np.repeat(np.arange(12), 10)
    theta = _RNG.normal(size=(silo.size, 4)) + silo[:, None] * 0.3
    ids = [f'assist_group_{i:02d}' for i in range(12)]
    hpfl_analysis.private_components_analysis({'distributed': theta, 'hpfl': theta[::-1]}, silo, ids, path)


def _attribute_distribution(path):
    data = synthetic_user_modeling.generate_user_modeling(
        num_clients=3, users_per_client=6, num_items=60, items_per_client=30, records_per_user=(5, 20)
    )
    user_modeling.plot_attribute_distribution(data, path)


def _embeddings(path):
    emb = _RNG.normal(size=(40, 4))
    furl_embeddings.embedding_analysis(emb, emb + 0.1, _RNG.random(40), path, k=3, seed=0)


def _projections(path):
    z, c = _RNG.normal(size=(30, 3)), _RNG.normal(size=(30, 3))
    clients = np.arange(30) % 3
    disentanglement.plot_projections(z, c, clients, path, method='pca', title='FedDVA', also_by=[('label', clients)])


def _manifold(path):
    disentanglement.plot_manifold_grids([('client 0', _RNG.random((3, 4, 5, 5, 1)))], path, title='Manifold')


def _accuracy_curves(path):
    curves = {
        (setting, method): [(r, 0.5 + 0.01 * r) for r in range(1, 6)]
        for setting in feddva_analysis.SETTING_NAMES
        for method in feddva_analysis.METHOD_NAMES
    }
    feddva_analysis.plot_accuracy_curves(curves, path, title='Accuracy')


FIGURES = {
    'learning_curves': _learning_curves,
    'private_components': _private_components,
    'attribute_distribution': _attribute_distribution,
    'user_embeddings': _embeddings,
    'projections': _projections,
    'manifold': _manifold,
    'accuracy_curves': _accuracy_curves,
}


def render(name, path, monkeypatch):
    """Runs the plotting function of `name` writing `path`; returns the figure it saved."""
    saved = []
    original = Figure.savefig
    monkeypatch.setattr(Figure, 'savefig', lambda fig, *a, **k: (saved.append(fig), original(fig, *a, **k))[1])
    FIGURES[name](path)
    (figure,) = saved
    return figure


def _panels(figure):
    return [ax for ax in figure.axes if getattr(ax, '_colorbar', None) is None]  # Colorbars are not panels.


@pytest.mark.parametrize('name', sorted(FIGURES))
def test_every_figure_has_labelled_axes_a_title_and_legends_that_cover_no_panel(tmp_path, monkeypatch, name):
    figure = render(name, str(tmp_path / f'{name}.png'), monkeypatch)
    assert (tmp_path / f'{name}.png').stat().st_size > 1000
    panels = _panels(figure)
    assert panels
    for ax in panels:
        assert ax.get_xlabel().strip() and ax.get_ylabel().strip(), (name, ax.get_title())
    suptitle = figure.get_suptitle() if hasattr(figure, 'get_suptitle') else figure._suptitle.get_text()
    assert suptitle.strip() or all(ax.get_title().strip() for ax in panels), name
    renderer = FigureCanvasAgg(figure).get_renderer()
    legends = list(figure.legends) + [ax.get_legend() for ax in figure.axes if ax.get_legend() is not None]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in panels:
            assert not box.overlaps(ax.get_tightbbox(renderer)), f'{name}: the legend covers {ax.get_title()!r}'
    if name in ('learning_curves', 'private_components', 'accuracy_curves'):
        assert len(legends) == 1 and not any(ax.get_legend() for ax in figure.axes)  # One for every panel.


def test_the_check_catches_a_legend_over_a_panel(tmp_path):
    fig, axes = program.new_figure(1, 2, figsize=(6, 3), squeeze=False)
    for ax in axes[0]:
        ax.plot([0, 1], [0, 1], label='a very long label of a run that needs room')
        ax.set_xlabel('round'), ax.set_ylabel('loss')
    fig.legend(loc='center right')  # Without a strip kept free for it: over the second panel.
    renderer = FigureCanvasAgg(fig).get_renderer()
    box = fig.legends[0].get_window_extent(renderer)
    assert box.overlaps(axes[0][1].get_tightbbox(renderer))
