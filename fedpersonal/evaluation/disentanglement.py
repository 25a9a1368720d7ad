"""Evidence of personalization disentanglement (FedDVA): linear probes, manifold grids, 2-D projections.

* `linear_probe_accuracy`: a multinomial logistic regression (standardized inputs) fitted on one set of
  representations and scored on another: if c carries the client and z the content, the client is predictable
  from c (not from z) and the label from z (better than from c).
* `probe_report`: the probe table over {z, c} x {client, label, mark type}.
* `plot_manifold_grids`: per client panel, a grid whose rows vary z and columns vary c, decoded by that client's
  decoder (the paper's Fig. 3b).
* `plot_projections`: t-SNE (or PCA) of z and of c side by side, coloured by client (the paper's Fig. 5).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np

from fedpersonal import program


def linear_probe_accuracy(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    test_features: np.ndarray,
    test_labels: np.ndarray,
    seed: int = 0,
) -> float:
    """Test accuracy of a logistic-regression probe (features standardized with the training statistics)."""
    from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top

    if train_features.shape[0] != train_labels.shape[0] or test_features.shape[0] != test_labels.shape[0]:
        raise ValueError('features and labels must have the same number of rows')
    if np.unique(train_labels).size < 2:
        return float(np.mean(test_labels == train_labels[0]))
    mean = train_features.mean(axis=0)
    std = train_features.std(axis=0) + 1e-6
    probe = LogisticRegression(max_iter=2000, random_state=seed)
    probe.fit((train_features - mean) / std, train_labels)
    return float(probe.score((test_features - mean) / std, test_labels))


def probe_report(
    train: Mapping[str, np.ndarray],
    test: Mapping[str, np.ndarray],
    targets: Sequence[str] = ('client', 'label', 'mark'),
    seed: int = 0,
) -> dict[str, float]:
    """Probe accuracies `probe_<target>_from_<z|c>` plus the majority-class baseline `chance_<target>`.

    Args:
      train: Arrays 'z', 'c' and one per target (probe training set).
      test: The same keys (probe test set).
      targets: Which targets to probe (a target whose training labels are constant is skipped).
      seed: Probe randomness.
    """
    report = {}
    for target in targets:
        if target not in train or np.unique(train[target]).size < 2:
            continue
        for rep in ('z', 'c'):
            report[f'probe_{target}_from_{rep}'] = linear_probe_accuracy(
                train[rep], train[target], test[rep], test[target], seed
            )
        counts = np.bincount(train[target])
        report[f'chance_{target}'] = float(np.mean(test[target] == np.argmax(counts)))
    return report


def plot_manifold_grids(panels: Sequence[tuple[str, np.ndarray]], path: str, title: str = '') -> str:
    """Saves one image grid per panel side by side.

    Args:
      panels: (title, images `[rows, cols, h, w, channels]` in [0, 1]) pairs; rows vary z, columns vary c.
      path: PNG path.
      title: Figure title.
    """
    fig, axes = program.new_figure(1, len(panels), figsize=(3.2 * len(panels), 3.6), squeeze=False)
    for ax, (panel_title, images) in zip(axes[0], panels):
        rows, cols, h, w, ch = images.shape
        canvas = np.ones([rows * (h + 1) - 1, cols * (w + 1) - 1, ch], np.float32)
        for r in range(rows):
            for c in range(cols):
                canvas[r * (h + 1) : r * (h + 1) + h, c * (w + 1) : c * (w + 1) + w] = images[r, c]
        ax.imshow(canvas[..., 0] if ch == 1 else canvas, cmap='gray' if ch == 1 else None, vmin=0, vmax=1)
        ax.set_title(panel_title, fontsize=9)
        ax.set_xlabel('c varies (columns)', fontsize=8)
        ax.set_ylabel('z varies (rows)', fontsize=8)
        ax.set_xticks([]), ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def project_2d(x: np.ndarray, method: str = 'tsne', seed: int = 0) -> np.ndarray:
    """2-D embedding of the rows of `x` ('tsne' or 'pca'; a 2-D input is returned as is)."""
    if x.shape[1] <= 2:
        return np.pad(x, [(0, 0), (0, 2 - x.shape[1])])
    if method == 'pca':
        centred = x - x.mean(axis=0)
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        return centred @ vt[:2].T
    if method != 'tsne':
        raise ValueError(f"method must be 'tsne' or 'pca', got {method!r}")
    from sklearn.manifold import TSNE  # pylint: disable=g-import-not-at-top

    return TSNE(
        n_components=2, perplexity=min(30, max(5, x.shape[0] // 4)), random_state=seed, init='pca'
    ).fit_transform(x)


def plot_projections(
    z: np.ndarray,
    c: np.ndarray,
    clients: np.ndarray,
    path: str,
    *,
    method: str = 'tsne',
    seed: int = 0,
    title: str = '',
    also_by: Sequence[tuple[str, np.ndarray]] = (),
) -> str:
    """Scatter plots of 2-D projections of z (left) and c (right), coloured by client.

    Args:
      z: ``[n, z_dim]`` shared representations.
      c: ``[n, c_dim]`` personalized representations.
      clients: ``[n]`` int client ids (the colour of the first row).
      path: The PNG to write.
      method: 'tsne' or 'pca' (`project_2d`).
      seed: Seed of the projection.
      title: Figure title.
      also_by: More rows with the same projections coloured by other integer labels, as ``(name, values [n])``
        (e.g. the class label and the client's mark type: c should separate what the client changes, z the
        content).
    """
    colourings = [('client', np.asarray(clients))] + [(name, np.asarray(v)) for name, v in also_by]
    projections = [(project_2d(z, method, seed), 'z (shared)'), (project_2d(c, method, seed), 'c (personalized)')]
    fig, axes = program.new_figure(len(colourings), 2, figsize=(11, 4.6 * len(colourings)), squeeze=False)
    for row, (label_name, values) in enumerate(colourings):
        top = max(int(values.max()) if values.size else 0, 1)
        cmap = program.colormap('tab10' if top < 10 else 'tab20', top + 1)  # One colour per value.
        for ax, (xy, name) in zip(axes[row], projections):
            points = ax.scatter(xy[:, 0], xy[:, 1], c=values, cmap=cmap, s=6, vmin=-0.5, vmax=top + 0.5)
            ax.set_title(f'{name} ({method}), coloured by {label_name}')
            ax.set_xlabel(f'{method} dimension 1')
            ax.set_ylabel(f'{method} dimension 2')
            ax.set_xticks([]), ax.set_yticks([])  # A projection's coordinates have no unit of their own.
        fig.colorbar(points, ax=list(axes[row]), label=label_name)
    if title:
        fig.suptitle(title)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
