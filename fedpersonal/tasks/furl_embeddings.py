"""FURL's analysis of the user embeddings learned on the server and in FL: k-nearest-neighbour overlap and a
t-SNE projection of both sets side by side."""

from __future__ import annotations

import numpy as np

from fedpersonal import program


def knn_overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """Mean |kNN_a(u) & kNN_b(u)| / k over users (cosine similarity); chance is about k / (n - 1)."""

    def neighbours(x):
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        sim = x @ x.T
        np.fill_diagonal(sim, -np.inf)
        return np.argsort(-sim, axis=1)[:, :k]

    na, nb = neighbours(a), neighbours(b)
    return float(np.mean([len(set(na[i]) & set(nb[i])) / k for i in range(a.shape[0])]))


def embedding_analysis(
    server: np.ndarray,
    fl: np.ndarray,
    rate: np.ndarray,
    path: str,
    k: int,
    seed: int,
    rate_label: str = 'user positive rate',
) -> dict[str, float]:
    """t-SNE of both embedding sets side by side (coloured by the user's positive rate) + kNN overlap."""
    from sklearn.manifold import TSNE  # pylint: disable=g-import-not-at-top

    overlap = knn_overlap(server, fl, k)
    chance = k / max(server.shape[0] - 1, 1)
    fig, axes = program.new_figure(1, 2, figsize=(11, 4.8))
    for ax, emb, title in ((axes[0], server, 'Personalized Server'), (axes[1], fl, 'Personalized FL')):
        xy = TSNE(
            n_components=2, perplexity=min(30, max(5, emb.shape[0] // 4)), random_state=seed, init='pca'
        ).fit_transform(emb)
        points = ax.scatter(xy[:, 0], xy[:, 1], c=rate, cmap='viridis', s=10)
        ax.set_title(f'{title} (t-SNE)')
        ax.set_xlabel('t-SNE dimension 1')
        ax.set_ylabel('t-SNE dimension 2')
        ax.set_xticks([]), ax.set_yticks([])  # t-SNE coordinates have no unit: only neighbourhoods mean something.
    fig.colorbar(points, ax=axes, label=rate_label)
    program.save_figure(
        fig,
        path,
        title=f'User embeddings; {k}-NN overlap of the two sets: {overlap:.3f} (chance {chance:.3f})',
        tight_layout=False,
    )
    return {'knn_overlap': overlap, 'knn_chance': chance, 'knn_k': k}
