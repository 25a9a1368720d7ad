"""The fast simulation engine gives the per-client path's results (FedRecon), and refuses what it cannot do."""

import collections
import re
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import backends
from fedpersonal.data import dataset_split
from fedpersonal.models import matrix_factorization as mf
from fedpersonal.simulation import functional
from tests import tolerances
from tests.simulation import next_word_data

NUM_ITEMS = 30
SGD = tff.learning.optimizers.build_sgdm


def client_datasets(sizes, seed=0, batch=5):
    rng = np.random.default_rng(seed)
    datasets = []
    for n in sizes:
        items = rng.integers(0, NUM_ITEMS, n).astype(np.int64)
        ratings = rng.integers(1, 6, n).astype(np.float32)
        datasets.append(
            tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=items[:, None], y=ratings[:, None])).batch(
                batch
            )
        )
    return datasets


# Unequal sizes, a client smaller than one batch (3), one with a single example (empty query set).
SIZES = (12, 7, 1, 30, 4, 3)

CONFIGS = {
    'sgd_hash_split': dict(
        model=dict(num_latent_factors=4),
        build=dict(dataset_split=algorithms.ReconstructionSplit(recon_epochs=2)),
    ),
    'adam_joint_learned_init_uniform_biases_l2': dict(
        model=dict(num_latent_factors=3, add_biases=True, l2_regularization=0.01),
        build=dict(
            client_optimizer=tff.learning.optimizers.build_adam(0.01),
            server_optimizer=tff.learning.optimizers.build_adam(0.05),
            dataset_split=algorithms.ReconstructionSplit(strategy='order', recon_steps_max=3, post_recon_epochs=2),
            jointly_train_locals=True,
            learn_local_init=True,
            client_weighting=tff.learning.ClientWeighting.UNIFORM,
        ),
    ),
    'custom_split_function': dict(
        model=dict(num_latent_factors=4),
        build=dict(dataset_split=dataset_split.build_dataset_split_fn(algorithms.ReconstructionSplit())),
    ),
}


def build(config, simulation, **extra):
    return algorithms.build_fed_recon(
        mf.personal_model_fn(num_items=NUM_ITEMS, **config['model']),
        loss_fn=tf.keras.losses.MeanSquaredError,
        metrics_fn=lambda: [tf.keras.metrics.MeanSquaredError(name='mse')],
        reconstruction_optimizer=SGD(0.1),
        simulation=simulation,
        **{'client_optimizer': SGD(0.1), **config['build'], **extra},
    )


def run(process, rounds, datasets, through_tff=False):
    state, ids = process.initialize(), [str(i) for i in range(len(datasets))]
    for _ in range(rounds):
        if through_tff:  # `next` in TFF's runtime (no XLA there), instead of the driver's compiled round.
            output = process.next(state, process.backend.pack(datasets, client_ids=ids))
        else:
            # A round with a non-finite client goes on (its update left out), as TFF's `next` does.
            output = process.run_round(state, datasets, client_ids=ids, non_finite='ignore')
        state = output.state
    return process.get_model_weights(state), output.metrics


# The longest chain of additions feeding a weight in one step: the rating's dot product of latent factors (at most
# 4, plus 2 biases), the batch's gradient sum (5) and the mean over the round's 6 clients. A client runs at most
# 30 / 5 batches x 4 epochs (2 reconstruction, 2 training) = 24 steps a round.
DEPTH = 6 + 5 + 6
STEPS_PER_ROUND = 24


def assert_same(weights_a, metrics_a, weights_b, metrics_b, rounds=3, depth=DEPTH, steps_per_round=STEPS_PER_ROUND):
    steps = rounds * steps_per_round
    for a, b in zip(tf.nest.flatten(weights_a), tf.nest.flatten(weights_b)):
        tolerances.assert_reordered_close(a, b, depth=depth, steps=steps)
    train_a, train_b = metrics_a['client_work']['train'], metrics_b['client_work']['train']
    assert list(train_a) == list(train_b)
    for name in train_b:  # Sums over the round's (at most 57) examples of values from the weights.
        tolerances.assert_reordered_close(float(train_a[name]), float(train_b[name]), depth=depth + 57, steps=steps)
    assert int(metrics_a['finalizer']['update_non_finite']) == int(metrics_b['finalizer']['update_non_finite'])


# The SGD configuration runs again under another instruction set (scripts/test.sh); Adam's scales its steps the same.
@pytest.mark.parametrize(
    'name', [pytest.param(n, marks=[pytest.mark.numeric] * (n == 'sgd_hash_split')) for n in sorted(CONFIGS)]
)
def test_engine_equals_per_client_path(name):
    datasets = client_datasets(SIZES)
    reference_process = build(CONFIGS[name], 'per_client')
    reference = run(reference_process, 3, datasets)
    process = build(CONFIGS[name], 'engine', group_size=4)
    engine = run(process, 3, datasets)  # Two groups, the last padded.
    assert_same(*engine, *reference)
    assert process.backend.round_runner.traces == 1  # Traced once for the experiment, not per round or group.
    initial = reference_process.initialize().global_model_weights.trainable[0]
    assert not np.allclose(reference[0].trainable[0], initial)  # The rounds trained something.


def test_engine_round_in_tff_runtime_equals_compiled_round():
    """`process.next` (TFF's runtime) and `process.run_round` (the driver's XLA round) agree."""
    datasets = client_datasets(SIZES, seed=1)
    process = build(CONFIGS['sgd_hash_split'], 'engine', group_size=3)
    compiled = run(process, 2, datasets)
    assert 'client_update' not in process.parts  # run_round did not trace TFF's copy of the client work ...
    assert_same(*run(process, 2, datasets, through_tff=True), *compiled)
    assert 'client_update' in process.parts  # ... `next` built it on first use.


def test_non_finite_client_is_dropped_alone_like_the_per_client_path():
    datasets = client_datasets((10, 10, 10), seed=2)
    huge = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=np.arange(10, dtype=np.int64)[:, None], y=np.full([10, 1], 3e38, np.float32))
    ).batch(5)
    datasets.insert(1, huge)
    config = CONFIGS['sgd_hash_split']
    engine = run(build(config, 'engine'), 1, datasets)
    reference = run(build(config, 'per_client'), 1, datasets)
    assert np.all(np.isfinite(engine[0].trainable[0]))
    assert_same(*engine, *reference)
    without = run(build(config, 'engine'), 1, datasets[:1] + datasets[2:])
    tolerances.assert_reordered_close(engine[0].trainable[0], without[0].trainable[0], depth=DEPTH, steps=24)


@pytest.mark.parametrize(
    'extra, named',
    [
        (
            dict(
                model_aggregator=tff.learning.dp_aggregator(noise_multiplier=0.1, clients_per_round=2),
                client_weighting=tff.learning.ClientWeighting.UNIFORM,
            ),
            'cannot apply',
        ),
        (dict(model_aggregator=tff.learning.robust_aggregator(zeroing=True, clipping=False)), 'cannot apply'),
        (dict(client_optimizer=lambda: tf.keras.optimizers.SGD(0.1)), 'Keras optimizer'),
        (dict(client_weighting=lambda metrics: 1.0), 'callable'),
    ],
)
def test_what_the_engine_cannot_run_falls_back_to_the_per_client_backend_saying_why(extra, named):
    with mock.patch.object(backends.logging, 'info') as log:
        process = build(CONFIGS['sgd_hash_split'], 'engine', **extra)
    assert process.simulation == 'per_client'
    (message, *args), _ = log.call_args
    assert re.match(f'FedRecon runs on the per-client backend: .*{named}', message % tuple(args), flags=re.S)
    weights, metrics = run(process, 1, client_datasets(SIZES[:3]))
    assert np.isfinite(float(metrics['client_work']['train']['loss']))


@pytest.mark.parametrize(
    'split',
    [
        algorithms.ReconstructionSplit(),
        algorithms.ReconstructionSplit(strategy='order', support_fraction=0.3, recon_epochs=3, recon_steps_max=4),
        algorithms.ReconstructionSplit(allow_overlap=True, post_recon_epochs=2, post_recon_steps_max=3),
    ],
)
def test_numpy_split_equals_dataset_split_function(split):
    regular = client_datasets((1, 2, 7, 23), seed=3)
    examples = regular[-1].unbatch()
    irregular = [  # Batches of other sizes than the first's: the numpy split re-batches them as tf.data does.
        examples.batch(3).concatenate(examples.batch(5)),
        examples.batch(4).concatenate(examples.batch(9)),  # A last batch larger than the first.
        regular[-1].concatenate(regular[-1].map(lambda b: tf.nest.map_structure(lambda t: t[:0], b))),  # Empty.
    ]
    for dataset in regular + irregular:
        support, query = dataset_split.build_dataset_split_fn(split)(dataset)
        fast_support, fast_query = dataset_split.split_batches(list(dataset.as_numpy_iterator()), split)
        for slow, fast in ((support, fast_support), (query, fast_query)):
            slow = list(slow.as_numpy_iterator())
            assert len(slow) == len(fast)
            for a, b in zip(slow, fast):
                tf.nest.assert_same_structure(a, b)
                for u, v in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
                    assert u.dtype == v.dtype and u.shape == v.shape
                    np.testing.assert_array_equal(u, v)


@pytest.mark.numeric
def test_functional_model_equals_the_keras_model():
    model_fn = mf.personal_model_fn(num_items=NUM_ITEMS, num_latent_factors=3, add_biases=True, l2_regularization=0.1)
    model = model_fn()
    functional_model = functional.FunctionalModel(model_fn)
    items = np.array([[0], [5], [29]], np.int64)
    weights = functional.Parts(
        *[
            [v.numpy() for v in group]
            for group in (
                model.global_trainable_variables,
                model.global_non_trainable_variables,
                model.local_trainable_variables,
                model.local_non_trainable_variables,
            )
        ]
    )
    tf.nest.map_structure(np.testing.assert_array_equal, functional_model.initial_weights, weights)
    predictions, regularization = functional_model(weights, items)
    # A rating: 3 factors' products and 2 biases summed; the regularization: squares of every weight summed.
    tolerances.assert_reordered_close(predictions, model.keras_model(items), depth=5)
    num_weights = sum(int(np.size(w)) for group in weights for w in group)
    tolerances.assert_reordered_close(regularization, tf.add_n(model.keras_model.losses), depth=num_weights)


@pytest.mark.numeric
def test_engine_equals_per_client_path_on_the_next_word_lstm_with_local_oov_embeddings():
    """An LSTM's gradient does not vectorize; its clients run in a compiled loop inside the group program."""
    from fedpersonal.models import next_word_prediction as nwp

    layout, datasets = next_word_data.LAYOUT, next_word_data.client_datasets()

    def build_nwp(simulation):
        return algorithms.build_fed_recon(
            next_word_data.model_fn,
            loss_fn=nwp.loss_fn,
            metrics_fn=nwp.metrics_fn(layout),
            client_optimizer=SGD(0.5),
            reconstruction_optimizer=SGD(0.5),
            simulation=simulation,
            group_size=2,
        )

    # An LSTM step: 5 time steps, each a gate's sums over the embedding and the state (4 + 5), backpropagated
    # through the 5 steps; the batch's sum (4), the softmax over 10 classes, the mean over 4 clients. A client runs
    # at most 3 batches x 2 epochs (reconstruction, training) a round.
    depth = 2 * 5 * (4 + 5) + 4 + 10 + 4
    engine, per_client = run(build_nwp('engine'), 2, datasets), run(build_nwp('per_client'), 2, datasets)
    assert_same(*engine, *per_client, rounds=2, depth=depth, steps_per_round=6)


def test_xla_compiles_embedding_models_but_not_recurrent_or_convolutional_ones():
    lstm = next_word_data.model_fn
    conv = lambda: tf.keras.Sequential([tf.keras.Input([4, 4, 1]), tf.keras.layers.Conv2D(2, 3)])
    transposed = lambda: tf.keras.Sequential([tf.keras.Input([4, 4, 1]), tf.keras.layers.Conv2DTranspose(2, 3)])
    dense = lambda: tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(2)])
    matrix_factorization = mf.personal_model_fn(num_items=NUM_ITEMS, num_latent_factors=3)
    models = [functional.FunctionalModel(f) for f in (matrix_factorization, dense, lstm, conv, transposed)]
    assert [m.xla for m in models] == [True, True, False, False, False]
    # A step vectorizes over clients except with per-client convolution filters (pfor cannot batch them).
    assert [m.vectorizes for m in models] == [True, True, True, False, False]


def test_fixed_clip_dp_is_applied_to_each_logical_client_like_the_per_client_path():
    """DP-FedAvg with a fixed clip on the engine: every logical client's update is clipped to C inside its group,
    the groups' sums are noised once (z * C, seeded) and divided by clients_per_round, as on the per-client path;
    TFF's `process.next` of the engine gives the same."""
    from fedpersonal.privacy import dp  # pylint: disable=g-import-not-at-top

    datasets = client_datasets(SIZES, seed=3)
    uniform = dict(client_weighting=tff.learning.ClientWeighting.UNIFORM)

    def aggregator(clip=0.05, z=0.5):
        return dp.build_dp_aggregator(noise_multiplier=z, clients_per_round=len(SIZES), clip=clip, noise_seed=3)

    config = CONFIGS['sgd_hash_split']
    reference = run(build(config, 'per_client', model_aggregator=aggregator(), **uniform), 2, datasets)
    engine_process = build(config, 'engine', group_size=4, model_aggregator=aggregator(), **uniform)
    engine = run(engine_process, 2, datasets)
    # The clip's norm sums the squares of every global weight (NUM_ITEMS items x (4 factors + a bias) at most).
    clipped = dict(depth=DEPTH + NUM_ITEMS * 5)
    assert_same(*engine, *reference, **clipped)
    assert engine[1]['aggregator'] == reference[1]['aggregator']
    assert_same(*run(engine_process, 2, datasets, through_tff=True), *engine, **clipped)

    # The clip binds (a clip no update reaches gives other weights), per logical client (a clip of each group's
    # sum at C would too), and the noise is there.
    unclipped = run(
        build(config, 'engine', group_size=4, model_aggregator=aggregator(clip=1e6, z=0.0), **uniform), 2, datasets
    )
    noiseless = run(build(config, 'engine', group_size=4, model_aggregator=aggregator(z=0.0), **uniform), 2, datasets)
    for other in (unclipped, noiseless):
        assert not np.allclose(other[0].trainable[0], engine[0].trainable[0], atol=1e-4)
