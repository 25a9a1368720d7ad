"""Client marks, Dirichlet label allocation, per-client splits and the generated default."""

import numpy as np
import pytest

from fedpersonal.data import federated_images as fi
from fedpersonal.data import image_datasets
from tests import tolerances


def test_mark_type_is_client_mod_4():
    assert [fi.mark_type(k) for k in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert fi.MARK_TYPES == ('none', 'horizontal_sine', 'vertical_sine', 'ellipse')


def test_marks_shapes_and_randomness():
    rng = np.random.default_rng(0)
    assert not fi.mark_masks(0, 3, 28, 28, rng).any()
    horizontal = fi.mark_masks(1, 2, 28, 28, rng)
    vertical = fi.mark_masks(2, 2, 28, 28, rng)
    ellipse = fi.mark_masks(3, 2, 28, 28, rng)
    for masks in (horizontal, vertical, ellipse):
        assert masks.shape == (2, 28, 28) and masks.min() >= 0 and masks.max() <= 1
        assert 20 < masks[0].sum() < 250  # A thin stroke, not a blob.
        assert not np.allclose(masks[0], masks[1])  # Random phase / rotation per image.
    # A horizontal stripe crosses every column, a vertical one every row.
    assert (horizontal[0] > 0.5).any(axis=0).all()
    assert (vertical[0] > 0.5).any(axis=1).all()
    # The ellipse is centred: symmetric under a 180-degree rotation.
    # The pixel offsets from the centre change sign exactly under the rotation, and so do their rotated coordinates.
    np.testing.assert_array_equal(ellipse[0], ellipse[0][::-1, ::-1])
    with pytest.raises(ValueError, match='mark kind'):
        fi.mark_masks(4, 1, 28, 28, rng)


def test_add_marks_is_pixelwise_max():
    rng = np.random.default_rng(1)
    images = rng.uniform(0, 1, size=[4, 28, 28, 1]).astype(np.float32)
    marked = fi.add_marks(images, 2, np.random.default_rng(5))
    masks = fi.mark_masks(2, 4, 28, 28, np.random.default_rng(5))
    np.testing.assert_array_equal(marked[..., 0], np.maximum(images[..., 0], masks).astype(marked.dtype))
    np.testing.assert_array_equal(fi.add_marks(images, 0, rng), images)


def test_dirichlet_proportions_uniform_vs_skewed():
    rng = np.random.default_rng(0)
    uniform = fi.dirichlet_class_proportions(200, 10, 100.0, rng)
    skewed = fi.dirichlet_class_proportions(200, 10, 0.5, rng)
    # float64 draws normalized by their sum: 10 quotients and their sum, each rounded (2**-53).
    atol = tolerances.gamma(2 * 10, unit_roundoff=2.0**-53)
    np.testing.assert_allclose(uniform.sum(axis=1), 1.0, rtol=0, atol=atol)
    np.testing.assert_allclose(skewed.sum(axis=1), 1.0, rtol=0, atol=atol)
    assert uniform.max(axis=1).mean() < 0.16
    assert skewed.max(axis=1).mean() > 0.35
    with pytest.raises(ValueError, match='alpha must be positive'):
        fi.dirichlet_class_proportions(2, 10, 0.0, rng)


def test_allocate_disjoint_sizes_and_fractions():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 500)
    proportions = np.zeros([4, 10])
    proportions[:, 0] = 0.7
    proportions[:, 1:] = 0.3 / 9
    parts = fi.allocate(labels, proportions, 100, rng)
    flat = np.concatenate(parts)
    assert [p.size for p in parts] == [100] * 4 and np.unique(flat).size == 400
    assert all(np.sum(labels[p] == 0) == 70 for p in parts)
    # A class running out is topped up from the others.
    parts = fi.allocate(labels, np.tile(np.eye(10)[:1], (6, 1)), 100, rng)
    assert np.unique(np.concatenate(parts)).size == 600 and all(p.size == 100 for p in parts)
    with pytest.raises(ValueError, match='need 6000 examples, the split has 5000'):
        fi.allocate(labels, np.full([60, 10], 0.1), 100, rng)


def test_federate_splits_marks_and_client_data():
    source = fi.generate_default(600, 300, seed=0)
    assert source.train_images.shape == (600, 28, 28, 1) and source.num_classes == 10
    assert source.train_images.min() >= 0 and source.train_images.max() <= 1
    data = fi.federate(
        source, num_clients=5, train_per_client=40, test_per_client=20, alpha=0.3, marks=True, seed=1, setting='test'
    )
    assert data.client_ids == ['0', '1', '2', '3', '4']
    assert data.mark_types().tolist() == [0, 1, 2, 3, 0]
    assert all(data.train[c][0].shape == (40, 28, 28, 1) and data.test[c][1].shape == (20,) for c in data.client_ids)
    stats = data.statistics()
    assert stats['train_examples'] == 200 and stats['mean_top_class_share'] > 0.3
    # Marked clients have visibly more ink than unmarked ones with the same source.
    plain = fi.federate(source, num_clients=5, train_per_client=40, test_per_client=20, alpha=0.3, marks=False, seed=1)
    for c in ('1', '2', '3'):
        assert data.train[c][0].mean() > plain.train[c][0].mean() + 0.02
    np.testing.assert_array_equal(data.train['0'][0], plain.train['0'][0])
    images, labels, clients = data.pooled('test')
    assert images.shape[0] == labels.size == clients.size == 100
    client_data = data.client_data('train')
    element = next(iter(client_data.create_tf_dataset_for_client('3')))
    assert element['x'].shape == (28, 28, 1) and int(element['y']) == data.train['3'][1][0]


def test_federate_validation_split_is_held_out_from_the_same_draw():
    source = fi.generate_default(800, 300, seed=0)
    args = dict(num_clients=4, train_per_client=40, test_per_client=20, alpha=0.5, marks=True, seed=3)
    data = fi.federate(source, validation_per_client=10, **args)
    assert all(data.train[c][1].size == 40 and data.validation[c][1].size == 10 for c in data.client_ids)
    assert data.statistics()['validation_examples'] == 40
    # Disjoint from every client's training images (source images are distinct; marks are per client type).
    train = np.concatenate([data.train[c][0] for c in data.client_ids]).reshape(160, -1)
    held_out = np.concatenate([data.validation[c][0] for c in data.client_ids]).reshape(40, -1)
    assert not any(np.any(np.all(train == row, axis=1)) for row in held_out)
    # Train and validation are one draw of 50 per client split 40/10: exactly the data of 50 training images.
    drawn = fi.federate(source, **{**args, 'train_per_client': 50})
    for c in data.client_ids:
        for k in range(2):
            np.testing.assert_array_equal(np.concatenate([data.train[c][k], data.validation[c][k]]), drawn.train[c][k])
        np.testing.assert_array_equal(data.test[c][0], drawn.test[c][0])
    assert data.pooled('validation')[0].shape[0] == 40
    # Without validation the splits are as before and asking for one is a clear error.
    plain = fi.federate(source, **args)
    assert plain.validation == {} and plain.statistics()['validation_examples'] == 0
    with pytest.raises(ValueError, match='no validation split'):
        plain.client_data('validation')
    with pytest.raises(ValueError, match='validation_per_client >= 0'):
        fi.federate(source, validation_per_client=-1, **args)


def test_load_source_errors(tmp_path):
    with pytest.raises(ValueError, match="dataset 'mnist' needs --data_dir"):
        fi.load_source('mnist', None)
    with pytest.raises(image_datasets.ImageFormatError, match='no train images file'):
        fi.load_source('fashion_mnist', str(tmp_path))
    with pytest.raises(ValueError, match='unknown dataset'):
        fi.load_source('emnist', None)
