"""Issue 64 part 5: your own images (``--dataset=npz --data_path=``) and model (``--model=module:function``) in the
benchmark binary. 8 x 8 digits run end to end from the command line with a model factory from the user's own module,
labelled by the file's stem; every bad file, flag or model gets a clear message naming it, before any training."""

import json
import math
import os
import random
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from fedpersonal import errors
from fedpersonal.data import npz_images
from fedpersonal.models import image_classifiers
from fedpersonal.models import keras_factory
from fedpersonal.program import config_flags
from fedpersonal.tasks import pfl_benchmark
from fedpersonal.tasks import pfl_benchmark_methods

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = textwrap.dedent(
    """
    import tensorflow as tf

    def tiny(input_shape, num_classes):  # No seed: the factory is given only what it takes.
        return tf.keras.Sequential([
            tf.keras.Input(input_shape),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(32, activation='relu'),
            tf.keras.layers.Dense(num_classes),
        ])

    def softmax_end(input_shape, num_classes):
        return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(),
                                    tf.keras.layers.Dense(num_classes, activation='softmax')])

    def pooled_end(input_shape, num_classes, **kwargs):
        inputs = tf.keras.Input(input_shape)
        x = tf.keras.layers.Conv2D(num_classes, 3, padding='same')(inputs)
        return tf.keras.Model(inputs, tf.keras.layers.GlobalAveragePooling2D()(x))

    def wrong_size(input_shape, num_classes):
        return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])

    def fixed_input(num_classes):
        return tf.keras.Sequential([tf.keras.Input((28, 28, 1)), tf.keras.layers.Flatten(),
                                    tf.keras.layers.Dense(num_classes)])

    def not_a_model(input_shape, num_classes):
        return 'a model'

    def needs_depth(input_shape, num_classes, depth):
        return None

    def raises(input_shape):
        raise RuntimeError('out of ideas')

    NOT_CALLABLE = 3
    """
)


def digits_like(n=1797, seed=0):
    """8 x 8 digits (0..16, 10 classes): scikit-learn's if installed, else as many noisy class prototypes."""
    try:
        from sklearn import datasets  # pylint: disable=g-import-not-at-top
    except ImportError:
        rng = np.random.default_rng(seed)
        prototypes = rng.integers(0, 17, size=(10, 8, 8))
        y = np.arange(n) % 10
        return np.clip(prototypes[y] + rng.integers(-3, 4, size=(n, 8, 8)), 0, 16).astype(np.float64), y
    digits = datasets.load_digits()
    return digits.images, digits.target


@pytest.fixture(scope='module')
def user_module(tmp_path_factory):
    """The user's models module, importable as ``usermodels`` (its directory on sys.path)."""
    directory = tmp_path_factory.mktemp('user')
    (directory / 'usermodels.py').write_text(MODELS)
    sys.path.insert(0, str(directory))
    yield directory
    sys.path.remove(str(directory))
    sys.modules.pop('usermodels', None)


@pytest.fixture(scope='module')
def digits_path(tmp_path_factory):
    x, y = digits_like()
    path = tmp_path_factory.mktemp('data') / 'digits.npz'
    np.savez(path, x=x, y=y)
    return str(path)


def config(digits_path, **flags_):
    values = dict(
        dataset='npz', data_path=digits_path, num_clients=5, state_store='memory', seeds=(0,), output_dir='/tmp/x'
    )
    return pfl_benchmark.PflBenchmarkConfig(**{**values, **flags_})


def test_digits_run_end_to_end_from_the_command_line_labelled_by_the_file(tmp_path, digits_path, user_module):
    out = tmp_path / 'run'
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, 'experiments', 'pfl_benchmark.py'),
            '--dataset=npz',
            f'--data_path={digits_path}',
            '--model=usermodels:tiny',
            '--num_clients=5',
            '--configurations=fedavg,fedper',
            '--seeds=0',
            '--total_rounds=3',
            '--rounds_per_eval=3',
            '--client_learning_rate=0.05',
            '--state_store=memory',
            f'--output_dir={out}',
        ],
        cwd=ROOT,
        env={**os.environ, 'PYTHONPATH': os.pathsep.join([ROOT, str(user_module)])},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'Traceback' not in result.stderr
    with open(out / 'results.json') as f:
        results = json.load(f)
    assert (results['dataset'], results['statistics']['dataset'], results['model']) == (
        'digits',
        'digits',
        'usermodels:tiny',
    )
    assert result.stdout.lstrip().startswith('digits, pathological partition, 5 clients')
    rows = {row['method']: row for row in results['rows']}
    assert set(rows) == {'fedavg', 'fedper'}
    for row in rows.values():  # Chance is 0.1; FedPer's two classes per client are learned almost at once.
        assert math.isfinite(row['accuracy']) and row['accuracy'] > 0.3, row
    assert rows['fedper']['accuracy'] > 0.8, rows


def test_pixels_are_brought_to_unit_range_then_normalized_as_mnist(tmp_path, digits_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(300, 5, 7, 3), dtype=np.uint8)
    path = tmp_path / 'colour.npz'
    np.savez(path, x=images, y=np.arange(300) % 3)
    data = pfl_benchmark.load_data(config(str(path), num_clients=3, class_per_client=1))
    assert data.name == 'colour' and data.x.shape == (300, 5, 7, 3) and data.num_classes == 3
    np.testing.assert_allclose(np.sort(data.x.ravel()), np.sort((images / 255.0 - 0.5).ravel() / 0.5), atol=1e-6)
    digits = pfl_benchmark.load_data(config(digits_path))
    raw, _ = digits_like()
    assert digits.x.shape == (len(raw), 8, 8, 1)  # One channel added; 0..16 min-max scaled, then (x - 0.5) / 0.5.
    np.testing.assert_allclose(np.sort(digits.x.ravel()), np.sort(raw.ravel() / raw.max() * 2 - 1), atol=1e-6)


BAD_FILES = [
    (dict(x=np.zeros((20, 8, 8))), "no array y (it has ['x'])"),
    (dict(images=np.zeros((20, 8, 8)), y=np.zeros(20, int)), "no array x (it has ['images', 'y'])"),
    (
        dict(x=np.zeros((20, 64)), y=np.zeros(20, int)),
        'x has shape [20, 64]; expected images [N, H, W] or [N, H, W, C]',
    ),
    (dict(x=np.zeros((20, 3, 32, 32)), y=np.zeros(20, int)), 'x has shape [20, 3, 32, 32], which looks channels-first'),
    (dict(x=np.zeros((20, 8, 8)), y=np.zeros((20, 1), int)), 'y has shape [20, 1]; expected one integer label per'),
    (dict(x=np.zeros((20, 8, 8)), y=np.zeros(19, int)), 'x has 20 images but y 19 labels'),
    (dict(x=np.zeros((20, 8, 8)), y=np.full(20, 0.5)), 'y has non-integer labels (0.5 at row 0)'),
    (dict(x=np.zeros((20, 8, 8)), y=np.array(['a'] * 20)), 'y has dtype <U1; expected integer labels'),
    (dict(x=np.zeros((20, 8, 8)), y=np.r_[np.zeros(19, int), -1]), 'y has negative labels (-1 at row 19)'),
    (dict(x=np.r_[np.zeros((3, 8, 8)), np.full((1, 8, 8), np.nan)], y=np.arange(4)), 'NaN or infinite pixels in 1 '),
    (dict(x=np.full((4, 8, 8), 'p'), y=np.arange(4)), 'x has dtype <U1; expected numeric pixels'),
    (dict(x=np.zeros((4, 8, 8)), y=np.zeros(4, int)), 'y has a single class (0)'),
    (dict(x=np.zeros((0, 8, 8)), y=np.zeros(0, int)), 'no images'),
]


@pytest.mark.parametrize('arrays, message', BAD_FILES, ids=[m for _, m in BAD_FILES])
def test_a_bad_file_is_refused_naming_it_and_the_problem(tmp_path, arrays, message):
    path = tmp_path / 'mine.npz'
    np.savez(path, **arrays)
    with pytest.raises(errors.DataError, match=re.escape(f'--data_path={path}: ') + '.*' + re.escape(message)):
        npz_images.load_npz(str(path))


def test_a_file_that_is_not_npz_or_too_small_is_refused(tmp_path, digits_path):
    path = tmp_path / 'notes.npz'
    path.write_text('not a zip')
    with pytest.raises(errors.DataError, match='not readable as a .npz file'):
        npz_images.load_npz(str(path))
    single = tmp_path / 'one.npy'
    np.save(single, np.zeros(3))
    with pytest.raises(errors.DataError, match='a single .npy array, not a .npz archive'):
        npz_images.load_npz(str(single))
    small = tmp_path / 'small.npz'
    np.savez(small, x=np.zeros((100, 8, 8)), y=np.arange(100) % 10)
    with pytest.raises(errors.DataError, match=r'100 images for 20 clients, each needing at least 14 .* at least 280'):
        pfl_benchmark.load_data(config(str(small), num_clients=20))
    with pytest.raises(
        errors.ConfigError,
        match=re.escape(
            f'--data_path={digits_path} (1797 images, 10 classes) cannot be partitioned by --partition=pathological'
        ),
    ):
        pfl_benchmark.load_data(config(digits_path, class_per_client=11))


@pytest.mark.parametrize(
    'flags_, message',
    [
        (dict(data_path=None), '--dataset=npz needs --data_path'),
        (dict(data_path='/nonexistent/d.npz'), '--data_path=/nonexistent/d.npz does not exist'),
        (dict(dataset='synthetic'), '--data_path applies to --dataset=npz only, got --dataset=synthetic'),
        (dict(data_dir='/tmp'), '--data_dir=/tmp names another dataset'),
        (dict(model='usermodels.tiny'), "--model=usermodels.tiny: expected a Keras model factory as 'module:function'"),
        (dict(dataset='movielens_synthetic', data_path=None, model='a:b'), '--model is the image model'),
    ],
)
def test_bad_flags_name_the_flag(digits_path, flags_, message):
    with pytest.raises(errors.ConfigError, match=re.escape(message)):
        config(digits_path, **flags_)


@pytest.mark.parametrize(
    'model, message',
    [
        ('no_such_module:tiny', "cannot import module 'no_such_module' (ModuleNotFoundError"),
        ('usermodels:absent', "module 'usermodels' has no 'absent'"),
        ('usermodels:NOT_CALLABLE', "'NOT_CALLABLE' is a int, not a callable factory"),
        ('usermodels:not_a_model', 'returned a str, expected a tf.keras.Model'),
        ('usermodels:wrong_size', 'the model outputs shape [None, 3]; the data has 10 classes'),
        ('usermodels:fixed_input', 'the model takes inputs of shape [None, 28, 28, 1]; the images are [None, 8, 8, 1]'),
        ('usermodels:softmax_end', 'ends in a softmax; the loss takes logits'),
        ('usermodels:needs_depth', "the factory requires ['depth']"),
        ('usermodels:raises', "calling it with {'input_shape': (8, 8, 1)} failed (RuntimeError: out of ideas)"),
    ],
)
def test_a_bad_model_is_refused_up_front_naming_the_flag(digits_path, user_module, model, message):
    del user_module
    checked = config(digits_path, model=model)
    with pytest.raises(errors.ConfigError, match=re.escape(f'--model={model}: ') + '.*' + re.escape(message)):
        pfl_benchmark.check_model(checked, pfl_benchmark.load_data(checked))


def test_a_method_with_a_head_needs_a_final_dense_layer(digits_path, user_module):
    del user_module
    checked = config(digits_path, model='usermodels:pooled_end', configurations=('fedavg',))
    data = pfl_benchmark.load_data(checked)
    assert pfl_benchmark.check_model(checked, data) == 'usermodels:pooled_end'  # FedAvg splits nothing.
    for method in ('fedper', 'lg_fedavg', 'fedrod'):
        checked = config(digits_path, model='usermodels:pooled_end', configurations=('fedavg', method))
        with pytest.raises(
            errors.ConfigError, match=f'{method} keeps a head on the clients, the last layer, which must'
        ):
            pfl_benchmark.check_model(checked, data)


def test_small_images_without_model_ask_for_one_and_the_leaderboard_keeps_pfllibs_cnn(digits_path):
    checked = config(digits_path)
    with pytest.raises(errors.ConfigError, match=re.escape("images of 8 x 8; PFLlib's CNN (the default model) needs")):
        pfl_benchmark.check_model(checked, pfl_benchmark.load_data(checked))
    synthetic = pfl_benchmark.PflBenchmarkConfig(dataset='synthetic', synthetic_examples=1200, num_clients=5)
    assert pfl_benchmark.check_model(synthetic, pfl_benchmark.load_data(synthetic)) == 'pfllib_cnn'
    small_cnn = config(digits_path, model='fedpersonal.models.image_classifiers:small_cnn')
    assert pfl_benchmark.check_model(small_cnn, pfl_benchmark.load_data(small_cnn)) == small_cnn.model


def test_the_head_is_the_last_layer_and_pfllibs_split_is_unchanged(user_module):
    del user_module
    cnn = image_classifiers.fedavg_cnn()
    assert pfl_benchmark_methods.local_layer_names(cnn, image_classifiers.HEAD) == list(image_classifiers.HEAD)
    assert pfl_benchmark_methods.local_layer_names(cnn, image_classifiers.BODY) == list(image_classifiers.BODY)
    model = keras_factory.build('usermodels:tiny', (8, 8, 1), 10)
    dense = [layer.name for layer in model.layers if isinstance(layer, tf.keras.layers.Dense)]
    assert pfl_benchmark_methods.local_layer_names(model, image_classifiers.HEAD) == dense[-1:]
    assert pfl_benchmark_methods.local_layer_names(model, image_classifiers.BODY) == dense[:-1]


def test_help_lists_the_new_flags():
    values = flags.FlagValues()
    config_flags.define_flags(pfl_benchmark.PflBenchmarkConfig, flag_values=values)
    help_text = values.get_help()
    for flag in ('--data_path', '--model', 'npz'):
        assert flag in help_text
    assert 'module:function' in help_text and 'mypackage.models:small_cnn' in help_text


def test_a_factory_without_a_seed_gives_the_same_weights_every_call_and_leaves_the_global_seeds(user_module):
    """`tiny` takes no seed: it is built under the run's seed (same seed, same numbers; a run's initial weights come
    from one such call in each process), and the caller's Python, NumPy and TF random streams are as before."""
    del user_module

    def weights(seed):
        return [w.copy() for w in keras_factory.build('usermodels:tiny', (8, 8, 1), 10, seed=seed).get_weights()]

    random.seed(3)
    np.random.seed(3)
    tf.random.set_seed(3)
    expected = (random.random(), np.random.random(), float(tf.random.uniform([])))
    random.seed(3)
    np.random.seed(3)
    tf.random.set_seed(3)
    first, again, other = weights(0), weights(0), weights(1)
    assert (random.random(), np.random.random(), float(tf.random.uniform([]))) == expected
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], other[0])
