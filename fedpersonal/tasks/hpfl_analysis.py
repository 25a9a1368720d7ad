"""HPFL experiment: metrics of predictions, the private-components analysis and the printed tables.

Split from `fedpersonal.tasks.hpfl_user_modeling` (which runs the rows) so each module keeps one job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedpersonal import program
from fedpersonal.metrics import user_modeling_metrics as um_metrics
from fedpersonal.models import gum

ROW_NAMES = {  # Row name of every method in tables and results.
    'ncd': 'NCD',
    'ncf': 'NCF',
    'gum': 'GUM',
    'distributed': 'Distributed',
    'fedsgd': 'FedSGD',
    'fedavg': 'FedAvg',
    'fednoise': 'Fednoise',
    'fedprox': 'FedProx',
    'fedatt': 'FedAtt',
    'hpfl_k': 'HPFL-K',
    'hpfl_r': 'HPFL-R',
    'hpfl': 'HPFL',
    'hpfl_inverse': 'HPFL (inverse distance)',
}


def evaluate_predictions(
    task: str,
    rating_range: Sequence[float],
    label: np.ndarray,
    prediction: np.ndarray,
    *,
    user: np.ndarray | None = None,
    item: np.ndarray | None = None,
    user_scores: np.ndarray | None = None,
    item_attributes: np.ndarray | None = None,
    ndcg_k: int = 10,
    ndcg_gain: str = 'linear',
) -> dict[str, float]:
    """The table's metrics of predictions on the original label scale.

    Binary task: ``accuracy``, ``auc``, ``rmse``; rating task: ``accuracy`` (rounded rating), ``mae``, ``rmse``.
    With `user` and `item` (stacked indices) also ``ndcg``; with `user_scores` ``[users, K]`` and
    `item_attributes` ``[items, K]`` also ``doa``.
    """
    label = np.asarray(label, np.float64)
    prediction = np.asarray(prediction, np.float64)
    if task == 'binary':
        out = {
            'accuracy': um_metrics.accuracy_binary(label, prediction),
            'auc': um_metrics.auc(label, prediction),
            'rmse': um_metrics.rmse(label, prediction),
        }
    else:
        out = {
            'accuracy': um_metrics.rating_accuracy(label, prediction, rating_range=(rating_range[0], rating_range[1])),
            'mae': um_metrics.mae(label, prediction),
            'rmse': um_metrics.rmse(label, prediction),
        }
    if user is not None:
        out['ndcg'] = um_metrics.ndcg(user, label, prediction, k=ndcg_k, gain=ndcg_gain)
    if user is not None and item is not None and user_scores is not None and item_attributes is not None:
        out['doa'] = um_metrics.doa(user, item, label, user_scores, item_attributes)
    return out


def gum_attribute_proficiency(public: gum.PublicWeights, theta: np.ndarray) -> np.ndarray:
    """A GUM user's proficiency on each attribute as the model uses it (the DOA score of GUM rows).

    For an item with the single attribute k (``q = e_k``, so ``q M = M[k]``), GUM's skill representation is
    ``sigmoid((theta_u * M[k]) skill_W)``; its mean over the h coordinates is what the prediction compares with the
    item's knowledge requirement (``x = mean(skill - knowledge) * w``), so the prediction for a fixed item rises with
    it (for ``w > 0`` and ``1 - S - G > 0``). Raw theta coordinates are not ordered that way: ``skill_W`` can weigh a
    coordinate negatively, so DOA on raw theta (reported as ``doa_theta``) can fall below 0.5 for a good model.

    Args:
      public: The (client's) public components.
      theta: ``[num_users, K]`` user embeddings.

    Returns:
      float64 ``[num_users, K]``.
    """
    theta = np.asarray(theta, np.float64)
    relation = np.asarray(public.relative_M, np.float64)
    skill = np.asarray(public.skill_W, np.float64)
    out = np.empty_like(theta)
    for start in range(0, theta.shape[0], 256):
        block = theta[start : start + 256][:, None, :] * relation[None, :, :]  # [u, k, K]
        out[start : start + 256] = (1.0 / (1.0 + np.exp(-(block @ skill)))).mean(axis=-1)
    return out


# ------------------------------------------------------------------------------------------------ analysis
def private_components_analysis(
    thetas: dict[str, np.ndarray],
    silo_of_user: np.ndarray,
    client_ids: Sequence[str],
    path: str | None = None,
    *,
    seed: int = 0,
    plot_methods: Sequence[str] = ('distributed', 'hpfl'),
) -> dict[str, Any]:
    """Are clients distinguishable from their users' private embeddings theta?

    Per method: ``probe_accuracy``, the 5-fold cross-validated accuracy (shuffled folds) of a multinomial
    logistic-regression probe predicting the client from a user's (standardized) theta row; ``chance``, the largest
    client's share of users; ``silhouette``, sklearn's silhouette score of theta with the client as the label
    (near 0 or negative: clients overlap; near 1: separated clusters). With `path`, a 2-D PCA projection of the
    `plot_methods` present, coloured by client (the 10 clients with most users), is saved there.

    Args:
      thetas: ``{method: [num_stacked_users, K]}``.
      silo_of_user: ``[num_stacked_users]`` client index of each row.
      client_ids: Names of the clients (for the legend).
      path: PNG path, or None.
      seed: Seed of the folds and the probe.
      plot_methods: Methods to project side by side.

    Returns:
      ``{'methods': {method: {...}}, 'num_users': n, 'num_clients': c, 'figure': path or None}``.
    """
    from sklearn.decomposition import PCA  # pylint: disable=g-import-not-at-top
    from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top
    from sklearn.metrics import silhouette_score  # pylint: disable=g-import-not-at-top
    from sklearn.model_selection import KFold  # pylint: disable=g-import-not-at-top
    from sklearn.model_selection import cross_val_score  # pylint: disable=g-import-not-at-top
    from sklearn.pipeline import make_pipeline  # pylint: disable=g-import-not-at-top
    from sklearn.preprocessing import StandardScaler  # pylint: disable=g-import-not-at-top

    labels = np.asarray(silo_of_user)
    counts = np.bincount(labels)
    chance = float(counts.max() / counts.sum())
    results: dict[str, Any] = {}
    for method, theta in thetas.items():
        theta = np.asarray(theta, np.float64)
        if theta.shape[0] != labels.size:
            raise ValueError(f'theta of {method!r} has {theta.shape[0]} rows for {labels.size} users.')
        probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0))
        folds = KFold(5, shuffle=True, random_state=seed)
        accuracy = float(np.mean(cross_val_score(probe, theta, labels, cv=folds)))
        silhouette = float(silhouette_score(theta, labels)) if len(set(labels)) > 1 else float('nan')
        results[method] = {'probe_accuracy': accuracy, 'chance': chance, 'silhouette': silhouette}
    figure = None
    shown = [m for m in plot_methods if m in thetas]
    if path and shown:
        import matplotlib  # pylint: disable=g-import-not-at-top

        top = np.argsort(-counts, kind='stable')[:10]
        fig, axes = program.new_figure(1, len(shown), figsize=(5.5 * len(shown) + 2.0, 4.8), squeeze=False)
        colours = matplotlib.colormaps['tab10']
        handles = []  # The same clients and colours in every panel: one legend beside them, covering no point.
        for ax, method in zip(axes[0], shown):
            pca = PCA(2, random_state=seed)
            xy = pca.fit_transform(np.asarray(thetas[method], np.float64))
            handles = [
                ax.scatter(xy[labels == c, 0], xy[labels == c, 1], s=8, color=colours(rank), alpha=0.7)
                for rank, c in enumerate(top)
            ]
            r = results[method]
            ax.set_title(
                f'{ROW_NAMES.get(method, method)}: probe acc {r["probe_accuracy"]:.2f} (chance '
                f'{r["chance"]:.2f}), silhouette {r["silhouette"]:.2f}',
                fontsize=9,
            )
            explained = pca.explained_variance_ratio_
            ax.set_xlabel(f'principal component 1 ({explained[0]:.0%} of the variance)')
            ax.set_ylabel(f'principal component 2 ({explained[1]:.0%} of the variance)')
            ax.grid(alpha=0.3)
        figure = program.save_figure_with_side_legend(
            fig,
            handles,
            [f'client {client_ids[c]}' for c in top],
            path,
            legend_inches=2.0,
            title='User embeddings theta (private components), PCA, coloured by client (largest 10 clients)',
        )
    return {'methods': results, 'num_users': int(labels.size), 'num_clients': int(counts.size), 'figure': figure}


# ------------------------------------------------------------------------------------------------ tables
def _cell(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return '-'
    return f'{value:.{digits}f}' if isinstance(value, float) else str(value)


def _metric_cell(row: dict[str, Any], metric: str) -> str:
    """A row's metric, with ``+- std`` when the row is a mean over several seeds."""
    std = row.get(f'{metric}_std')
    if std is None or len(row.get('seeds', [])) < 2 or _cell(row.get(metric)) == '-':
        return _cell(row.get(metric))
    return f'{_cell(row.get(metric))} +- {std:.3f}'


def format_statistics_table(statistics: dict[str, Any], dataset: str) -> str:
    """The paper's statistics table (one dataset column)."""
    keys = [
        ('# of clients', 'num_clients'),
        ('# of records', 'num_records'),
        ('# of users', 'num_users'),
        ('# of items', 'num_items'),
        ('# of attributes', 'num_attributes'),
        ('# attributes per item', 'attributes_per_item'),
        ('# attributes per record', 'attributes_per_record'),
        ("mean TV distance of a client's attribute mix to the pooled one", 'attribute_tv_distance_mean'),
        ('missing attributes per client (median)', 'missing_attributes_per_client_median'),
    ]
    lines = [f'| Statistics | {dataset} |', '|---|---|']
    for label, key in keys:
        value = statistics.get(key)
        lines.append(f'| {label} | {_cell(value, 2) if isinstance(value, float) or value is None else f"{value:,}"} |')
    return '\n'.join(lines)


def _count(value: float) -> str:
    """A round or epoch number; a mean over seeds that is not whole keeps one decimal (7.3, not 7.333333)."""
    return f'{value:.0f}' if float(value).is_integer() else f'{value:.1f}'


def format_accuracy_table(rows: list[dict[str, Any]], task: str) -> str:
    """The paper's accuracy table: ACC/AUC/RMSE (binary) or ACC/MAE/RMSE (rating), plus seconds per round."""
    metrics = ['accuracy', 'auc', 'rmse'] if task == 'binary' else ['accuracy', 'mae', 'rmse']
    head = ' | '.join('ACC' if m == 'accuracy' else m.upper() for m in metrics)
    lines = [f'| Method | {head} | s/round | selected round (epoch) |', '|---' * (len(metrics) + 3) + '|']
    for r in rows:
        selected = r.get('best_round', r.get('best_epoch'))
        spr = r.get('seconds_per_round')
        spr = f'{spr:.2f}' if spr is not None else f'({r.get("seconds_per_epoch", float("nan")):.2f} s/epoch)'
        if selected is not None:
            selected = _count(selected) + (f' (of {_count(r["rounds"])})' if r.get('rounds') is not None else '')
        cells = ' | '.join(_metric_cell(r, m) for m in metrics)
        lines.append(f'| {r["name"]} | {cells} | {spr} | {selected} |')
    return '\n'.join(lines)


def format_ranking_table(rows: list[dict[str, Any]]) -> str:
    """The paper's DOA/NDCG table: methods as columns."""
    lines = ['| | ' + ' | '.join(r['name'] for r in rows) + ' |', '|---' * (len(rows) + 1) + '|']
    for metric, label in (('doa', 'DOA'), ('ndcg', 'NDCG'), ('doa_theta', 'DOA on raw theta (GUM rows)')):
        lines.append(f'| {label} | ' + ' | '.join(_metric_cell(r, metric) for r in rows) + ' |')
    return '\n'.join(lines)


def format_private_table(analysis: dict[str, Any] | None) -> str:
    """Probe accuracy, chance and silhouette of the private-components analysis, one row per method."""
    if not analysis:
        return ''
    lines = ['| Method | client probe accuracy (5-fold) | chance | silhouette (client labels) |', '|---|---|---|---|']
    for method, r in analysis['methods'].items():
        lines.append(
            f'| {ROW_NAMES.get(method, method)} | {_cell(r["probe_accuracy"])} | {_cell(r["chance"])} | '
            f'{_cell(r["silhouette"])} |'
        )
    return '\n'.join(lines)
