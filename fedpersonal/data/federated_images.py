"""Federated image classification data with client personalities (FedDVA's settings).

* Client marks (heterogeneous inputs): the mark type of client `k` is `k mod 4` -- 0 none, 1 a horizontal sine
  stripe, 2 a vertical sine stripe, 3 an ellipse outline -- drawn on each of the client's images with a random
  phase (stripes) or rotation (ellipse) per image (`add_marks`).
* Label allocation (`dirichlet_class_proportions`): each client's class fractions are drawn from
  Dirichlet(alpha * 1) as in Hsu et al. 2019 (the FedDVA appendix): a large alpha (100) gives near-uniform labels
  (the heterogeneous-inputs setting), a small one (0.5) skewed labels (the heterogeneous-outputs setting).
* Per-client train/test splits: a client's training images come from the dataset's train split and its test
  images from the test split, both with the client's class fractions and mark type (`federate`).
* `generate_default`: a generated 10-class 28x28 dataset (stroke prototypes with random shifts, widths and noise)
  so the binaries run with no data present.

numpy only, except `FederatedImageData.client_data`, which builds a TFF `ClientData`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import numpy as np

from fedpersonal import errors
from fedpersonal.data import client_data as client_data_lib
from fedpersonal.data import image_datasets
from fedpersonal.data import tfds_sources

MARK_TYPES = ('none', 'horizontal_sine', 'vertical_sine', 'ellipse')


def mark_type(client_index: int) -> int:
    """The mark type of client `client_index` (an index into `MARK_TYPES`)."""
    return int(client_index) % len(MARK_TYPES)


def mark_masks(kind: int, n: int, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """`n` mark intensity masks in [0, 1] of one kind, `[n, height, width]`, random phase/rotation per mask.

    Args:
      kind: Index into `MARK_TYPES`.
      n: Number of masks.
      height: Image height.
      width: Image width.
      rng: Randomness for phases and rotations.
    """
    if kind not in range(len(MARK_TYPES)):
        raise errors.DataError(f'mark kind must be in 0..{len(MARK_TYPES) - 1}, got {kind}')
    rows = np.arange(height, dtype=np.float32)[None, :, None]
    cols = np.arange(width, dtype=np.float32)[None, None, :]
    if kind == 0:
        return np.zeros([n, height, width], np.float32)
    if kind in (1, 2):
        phase = rng.uniform(0, 2 * np.pi, size=[n, 1, 1]).astype(np.float32)
        along, across, size = (cols, rows, height) if kind == 1 else (rows, cols, width)
        centre = size * 0.5 + size * 0.22 * np.sin(2 * np.pi * along / (size * 0.5) + phase)
        return np.clip(1.6 - np.abs(across - centre), 0.0, 1.0).astype(np.float32)
    angle = rng.uniform(0, np.pi, size=[n, 1, 1]).astype(np.float32)
    y, x = rows - (height - 1) / 2.0, cols - (width - 1) / 2.0
    u = x * np.cos(angle) + y * np.sin(angle)
    v = -x * np.sin(angle) + y * np.cos(angle)
    radius = np.sqrt((u / (width * 0.42)) ** 2 + (v / (height * 0.22)) ** 2)
    return np.clip(1.0 - np.abs(radius - 1.0) * width * 0.3, 0.0, 1.0).astype(np.float32)


def add_marks(images: np.ndarray, kind: int, rng: np.random.Generator) -> np.ndarray:
    """`images` (`[n, h, w, c]` in [0, 1]) with marks of one kind drawn on every channel (pixel-wise max)."""
    if images.ndim != 4:
        raise errors.DataError(f'images must be [n, h, w, c], got shape {images.shape}')
    masks = mark_masks(kind, images.shape[0], images.shape[1], images.shape[2], rng)
    return np.maximum(images, masks[..., None]).astype(np.float32)


def dirichlet_class_proportions(
    num_clients: int, num_classes: int, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    """`[num_clients, num_classes]` class fractions, one Dirichlet(alpha * 1) draw per client (rows sum to 1)."""
    if alpha <= 0:
        raise errors.ConfigError(f'alpha must be positive, got {alpha}')
    return rng.dirichlet(np.full(num_classes, alpha), size=num_clients)


def allocate(
    labels: np.ndarray, proportions: np.ndarray, per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Indices into `labels` for each client: `per_client` examples drawn without replacement with the client's
    class fractions (largest-remainder rounding); if a class runs out, the remaining slots go to the classes
    with the most examples left. No example goes to two clients.

    Raises:
      ValueError: If `labels` has fewer than `num_clients * per_client` examples.
    """
    num_clients, num_classes = proportions.shape
    if num_clients * per_client > labels.size:
        raise errors.DataError(
            f'{num_clients} clients x {per_client} examples need {num_clients * per_client} '
            f'examples, the split has {labels.size}'
        )
    pools = [list(rng.permutation(np.flatnonzero(labels == k))) for k in range(num_classes)]
    result = []
    for client in range(num_clients):
        raw = proportions[client] * per_client
        counts = np.floor(raw).astype(int)
        for k in np.argsort(-(raw - counts))[: per_client - counts.sum()]:
            counts[k] += 1
        chosen = []
        shortfall = 0
        for k in range(num_classes):
            take = min(counts[k], len(pools[k]))
            shortfall += counts[k] - take
            chosen += pools[k][:take]
            pools[k] = pools[k][take:]
        while shortfall > 0:
            k = int(np.argmax([len(p) for p in pools]))
            chosen.append(pools[k].pop(0))
            shortfall -= 1
        result.append(np.asarray(rng.permutation(chosen), dtype=np.int64))
    return result


@dataclasses.dataclass
class FederatedImageData:
    """Per-client image classification data.

    Attributes:
      description: Human-readable (dataset and setting).
      client_ids: '0', '1', ... (client `k` has mark type `k mod 4` when marks are on).
      train: client id -> (images `[n, h, w, c]` float32, labels `[n]` int32).
      test: client id -> (images, labels).
      class_proportions: `[num_clients, num_classes]` fractions the labels were drawn with.
      marks: Whether client marks were drawn.
      num_classes: Number of classes.
      validation: client id -> (images, labels) held out for model selection (empty if none were drawn).
    """

    description: str
    client_ids: list[str]
    train: dict[str, tuple[np.ndarray, np.ndarray]]
    test: dict[str, tuple[np.ndarray, np.ndarray]]
    class_proportions: np.ndarray
    marks: bool
    num_classes: int = 10
    validation: dict[str, tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=dict)

    def split(self, name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The per-client data of split `name`: 'train', 'validation' or 'test'."""
        splits = {'train': self.train, 'validation': self.validation, 'test': self.test}
        if name not in splits:
            raise ValueError(f"split must be 'train', 'validation' or 'test', got {name!r}.")
        if name == 'validation' and not self.validation:
            raise errors.ConfigError('This data has no validation split (draw one with validation_per_client > 0).')
        return splits[name]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        height, width, channels = self.train[self.client_ids[0]][0].shape[1:]
        return height, width, channels

    def mark_types(self) -> np.ndarray:
        """Mark type of each client (all 0 when marks are off)."""
        return np.asarray([mark_type(int(c)) if self.marks else 0 for c in self.client_ids])

    def pooled(self, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(images, labels, client index) of all clients concatenated."""
        source = self.split(split)
        images = np.concatenate([source[c][0] for c in self.client_ids])
        labels = np.concatenate([source[c][1] for c in self.client_ids])
        clients = np.concatenate([np.full(source[c][1].size, i) for i, c in enumerate(self.client_ids)])
        return images, labels, clients

    def statistics(self) -> dict[str, Any]:
        sizes = [self.train[c][1].size for c in self.client_ids]
        top = [
            np.bincount(self.train[c][1], minlength=self.num_classes).max() / max(1, self.train[c][1].size)
            for c in self.client_ids
        ]
        return {
            'num_clients': len(self.client_ids),
            'train_examples': int(sum(sizes)),
            'validation_examples': int(sum(v[1].size for v in self.validation.values())),
            'test_examples': int(sum(self.test[c][1].size for c in self.client_ids)),
            'image_shape': list(self.image_shape),
            'marks': self.marks,
            'mean_top_class_share': float(np.mean(top)),
            'num_classes': self.num_classes,
        }

    def client_data(self, split: str = 'train'):
        """A `tff.simulation.datasets.ClientData` of `OrderedDict(x=image, y=label)` examples."""
        images, labels, clients = self.pooled(split)
        sizes = np.bincount(clients, minlength=len(self.client_ids))
        rows = np.split(np.arange(labels.size), np.cumsum(sizes)[:-1])
        return client_data_lib.from_partition(collections.OrderedDict(x=images, y=labels), rows, self.client_ids)


def federate(
    dataset: image_datasets.ImageDataset,
    *,
    num_clients: int,
    train_per_client: int,
    test_per_client: int,
    alpha: float,
    marks: bool,
    seed: int,
    setting: str = '',
    validation_per_client: int = 0,
) -> FederatedImageData:
    """Allocates a dataset to clients with Dirichlet class fractions and (optionally) client marks.

    Args:
      dataset: Source images.
      num_clients: Number of clients.
      train_per_client: Training examples per client (from the train split).
      test_per_client: Test examples per client (from the test split, same class fractions and marks).
      alpha: Dirichlet concentration (100: near-uniform labels; 0.5: skewed).
      marks: Draw client marks (mark type = client index mod 4).
      seed: Randomness of the allocation and the marks.
      setting: Recorded in the description.
      validation_per_client: Validation examples per client, drawn from the train split together with the
        client's training examples (same class fractions and marks, disjoint from them and from every other
        client's); 0 (the default) draws none and leaves the other splits as they were without it.
    """
    if num_clients < 1 or train_per_client < 1 or test_per_client < 1 or validation_per_client < 0:
        raise errors.ConfigError(
            'num_clients, train_per_client and test_per_client must be >= 1 and validation_per_client >= 0, got '
            f'{num_clients}, {train_per_client}, {test_per_client}, {validation_per_client}'
        )
    rng = np.random.default_rng(seed)
    proportions = dirichlet_class_proportions(num_clients, dataset.num_classes, alpha, rng)
    train_idx = allocate(dataset.train_labels, proportions, train_per_client + validation_per_client, rng)
    test_idx = allocate(dataset.test_labels, proportions, test_per_client, rng)
    ids = [str(i) for i in range(num_clients)]
    train: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    test: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    validation: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for i, cid in enumerate(ids):
        for out, images, labels, idx in (
            (train, dataset.train_images, dataset.train_labels, train_idx[i]),
            (test, dataset.test_images, dataset.test_labels, test_idx[i]),
        ):
            x = images[idx]
            if marks:
                x = add_marks(x, mark_type(i), rng)
            out[cid] = (x.astype(np.float32), labels[idx].astype(np.int32))
        if validation_per_client:  # The client's draw is in random order: its last examples are held out.
            x, y = train[cid]
            validation[cid] = (x[train_per_client:], y[train_per_client:])
            train[cid] = (x[:train_per_client], y[:train_per_client])
    description = (
        f'{dataset.name} ({setting or "custom"}: {num_clients} clients, Dirichlet alpha={alpha:g}, '
        f'marks {"on" if marks else "off"})'
    )
    return FederatedImageData(description, ids, train, test, proportions, marks, dataset.num_classes, validation)


def _segments(num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A few random strokes (`[k, 4]` endpoint coordinates in [5, 22]) per class."""
    return [rng.uniform(5, 22, size=[int(rng.integers(2, 4)), 4]) for _ in range(num_classes)]


def _render(strokes: np.ndarray, shift: np.ndarray, width: float, size: int = 28) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    image = np.zeros([size, size], np.float32)
    for y0, x0, y1, x1 in strokes:
        p0 = np.array([y0, x0]) + shift
        d = np.array([y1 - y0, x1 - x0])
        t = np.clip(((yy - p0[0]) * d[0] + (xx - p0[1]) * d[1]) / max(float(d @ d), 1e-6), 0, 1)
        dist = np.hypot(yy - (p0[0] + t * d[0]), xx - (p0[1] + t * d[1]))
        image = np.maximum(image, np.clip(width - dist, 0, 1))
    return image


def generate_default(num_train: int = 12000, num_test: int = 2000, seed: int = 0) -> image_datasets.ImageDataset:
    """A generated MNIST-shaped dataset: 10 classes of random stroke prototypes, 28x28x1 in [0, 1].

    Each image is its class's strokes, shifted by up to 3 pixels, with a random stroke width and pixel noise.
    """
    rng = np.random.default_rng(seed)
    prototypes = _segments(10, rng)

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = np.arange(n) % 10
        rng.shuffle(labels)
        images = np.stack([_render(prototypes[k], rng.uniform(-3, 3, size=2), rng.uniform(1.2, 2.2)) for k in labels])
        images = np.clip(images + rng.normal(0, 0.05, images.shape), 0, 1)
        return images[..., None].astype(np.float32), labels.astype(np.int32)

    train_images, train_labels = make(num_train)
    test_images, test_labels = make(num_test)
    return image_datasets.ImageDataset('generated', train_images, train_labels, test_images, test_labels)


def load_source(
    dataset: str,
    data_dir: str | None,
    *,
    generated_train: int = 12000,
    generated_test: int = 2000,
    seed: int = 0,
    tfds_data_dir: str | None = None,
) -> image_datasets.ImageDataset:
    """The source dataset by name: 'generated', 'mnist' (IDX in `data_dir`), 'fashion_mnist' (IDX in `data_dir`,
    default the Debian package's directory) or 'cifar10' (python pickles in `data_dir`). 'mnist' and
    'fashion_mnist' are read through TFDS when prepared in `tfds_data_dir` (`fedpersonal.data.tfds_sources`: None
    is TFDS's default directory, '' turns TFDS off; the same arrays either way)."""
    if dataset == 'generated':
        return generate_default(generated_train, generated_test, seed)
    if dataset in ('mnist', 'fashion_mnist'):
        return tfds_sources.load_image_dataset(dataset, data_dir=data_dir, tfds_data_dir=tfds_data_dir)
    if dataset == 'cifar10':
        if not data_dir:
            raise errors.ConfigError("dataset 'cifar10' needs --data_dir (a directory with the python batches)")
        return image_datasets.load_cifar10(data_dir)
    raise errors.ConfigError(
        f"unknown dataset {dataset!r}; expected 'generated', 'mnist', 'fashion_mnist' or 'cifar10'"
    )
