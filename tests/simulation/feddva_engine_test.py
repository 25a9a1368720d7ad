"""FedDVA on the fast simulation engine: the head phase tuning the encoders as on the per-client path (both backends
against a plain loop: tests/algorithms/feddva_test.py); batch norm as a pure function of its weights with padded
batches."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal.algorithms import feddva
from fedpersonal.models import feddva_models as fm
from fedpersonal.simulation import functional
from fedpersonal.simulation import lockstep
from fedpersonal.simulation import packing
from tests import tolerances

TINY = fm.DvaArchitecture(
    image_shape=(8, 8, 1),
    z_dim=2,
    c_dim=2,
    encoder_channels=(3,),
    decoder_dense=(5,),
    decoder_channels=(3, 2),
    head_hidden=3,
    num_classes=3,
)
BATCH = 4
# Unequal sizes: last batches of 1 and 2 examples, a client smaller than one batch (3), one empty.
SIZES = (9, 3, 0, 14, 6)
COHORTS = ([0, 1, 2, 3, 4], [3, 1], [4, 0, 3])


def datasets(sizes, seed=0, batch=BATCH):
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        x = rng.uniform(0, 1, size=[n, 8, 8, 1]).astype(np.float32)
        y = rng.integers(0, 3, size=n).astype(np.int32)
        dataset = tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))
        # As the FedDVA task: a seeded shuffle, reshuffled on every pass (so every phase and epoch sees another
        # order, and the same object iterated again would too).
        out.append(dataset.shuffle(100, seed=seed, reshuffle_each_iteration=True).batch(batch))
    return out


def build(simulation, head_tunes_encoders=False, **extra):
    kwargs = dict(decoder_epochs=1, z_epochs=2, c_epochs=1, head_epochs=2, learning_rate=1e-2, head_learning_rate=3e-2)
    return feddva.build_feddva(
        lambda: fm.DualVae(TINY, head_tunes_encoders=head_tunes_encoders, seed=3),
        element_spec=datasets([1])[0].element_spec,
        simulation=simulation,
        **{**kwargs, **extra},
    )


def run(process, cohorts=COHORTS, batch=BATCH):
    state = process.initialize()
    private = {c: process.initial_private_state() for c in range(len(SIZES))}
    data = datasets(SIZES, batch=batch)  # The same dataset objects every round.
    for cohort in cohorts:
        output = process.run_round(state, [data[c] for c in cohort], [private[c] for c in cohort])
        state = output.state
        private.update(zip(cohort, output.private_states))
    return process.get_model_weights(state), output.metrics['client_work']['train'], private


# Depth of the TINY dual VAE's head phase: the encoder's 3x3 convolution (9 terms), its dense layers over the 8 x 8
# x 3 feature map, the head's [z, c] (4), hidden (3) and classes (3) with the batch's standardization (16, twice),
# the batch's gradient sum (16), the mean over 5 clients; one step per client.
DEPTH = 9 + 8 * 8 * 3 + 4 + 3 + 3 + 2 * 16 + 16 + 5
# bn_model: the 3x3 convolution, the first batch norm's moments over a batch of 3 x 16 positions (twice), the
# dense layer's 32 inputs, the second batch norm's over 3 (twice), 4 and 3 outputs, a batch's gradient sum, and
# backward the same again: at most 3 steps a client.
BN_DEPTH = 2 * (9 + 2 * 48 + 32 + 2 * 3 + 4 + 3) + 3


def assert_close(a, b, depth=DEPTH, steps=1):
    tolerances.assert_reordered_close(np.asarray(a), np.asarray(b), depth=depth, steps=steps)


def test_engine_tunes_the_encoders_in_the_head_phase_as_the_per_client_path():
    """The head phase alone, encoders tuned, uniform weighting, one batch per client (of 9, 3, 14 and 6 examples).

    The head standardizes [mu_z, mu_c] with batch statistics, so the loss does not depend on the mu layers' biases:
    their gradient is zero up to float rounding, which Adam turns into a step of up to its learning rate, in the
    per-client path as in the engine (and the rounding differs). With one step per client nothing else sees them.
    """
    extra = dict(decoder_epochs=0, z_epochs=0, c_epochs=0, head_epochs=1, head_tunes_encoders=True)
    extra.update(client_weighting=tff.learning.ClientWeighting.UNIFORM)
    reference_process = build('per_client', **extra)
    reference = run(reference_process, cohorts=COHORTS[:1], batch=16)
    engine = run(build('engine', group_size=3, **extra), cohorts=COHORTS[:1], batch=16)
    names = [v.name for v in fm.DualVae(TINY).global_trainable]
    for name, a, b, start in zip(
        names,
        engine[0].trainable,
        reference[0].trainable,
        reference_process.initialize().global_model_weights.trainable,
    ):
        a, b, start = (np.asarray(v, np.float64) for v in (a, b, start))
        if name.endswith('_mu/bias:0'):
            assert np.max(np.abs(a - b)) <= 2 * 3e-2  # Rounding noise, one Adam step each.
        else:
            # Entries that neither path moved beyond one Adam step of rounding noise (a zero true gradient, e.g. a
            # bias that only shifts the standardized mu) are bounded; every other entry must agree.
            noise = (np.abs(a - start) <= 2 * 3e-2) & (np.abs(b - start) <= 2 * 3e-2) & (np.abs(a - b) <= 2 * 3e-2)
            moved = ~noise | (np.abs(b - start) > 1e-3)
            assert_close(a[moved], b[moved])
            assert not np.allclose(a, start) or 'logvar' in name  # Tuned (the log-variances are not used).
    for c in reference[2]:
        for a, b in zip(tf.nest.flatten(engine[2][c]), tf.nest.flatten(reference[2][c])):
            assert_close(a, b)
    for key, value in reference[1].items():
        assert_close(engine[1][key], value)


# ------------------------------------------------------------------------ batch norm as a function of its weights
def bn_model():
    init = tf.keras.initializers.GlorotUniform
    return tf.keras.Sequential(
        [
            tf.keras.Input([4, 4, 1]),
            tf.keras.layers.Conv2D(2, 3, padding='same', use_bias=False, kernel_initializer=init(seed=1)),
            tf.keras.layers.BatchNormalization(momentum=0.5),  # Fused (4D): moves towards the unbiased variance.
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(4, 'relu', kernel_initializer=init(seed=2)),
            tf.keras.layers.BatchNormalization(momentum=0.7),  # Not fused (2D): the biased variance.
            tf.keras.layers.Dense(3, kernel_initializer=init(seed=3)),
        ]
    )


def bn_client_data(sizes, batch=3, seed=1):
    rng = np.random.default_rng(seed)
    return [
        tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(
                x=rng.normal(size=[n, 4, 4, 1]).astype(np.float32) * 2 + 1, y=rng.integers(0, 3, n).astype(np.int32)
            )
        ).batch(batch)
        for n in sizes
    ]


@pytest.mark.numeric
def test_batch_norm_statistics_over_the_real_examples_of_a_padded_batch():
    model = functional.FunctionalModel(bn_model, batch_norm=True)
    x = np.random.default_rng(0).normal(size=[2, 4, 4, 1]).astype(np.float32)  # Smaller than the batch (5).
    padded = np.concatenate([x, np.full([3, 4, 4, 1], 7.0, np.float32)])
    predictions, _, updates = model.apply(
        model.initial_weights, padded, example_mask=np.array([1, 1, 0, 0, 0], np.float32)
    )
    keras_model = bn_model()
    expected = keras_model(x, training=True)  # Assigns the moving statistics.
    assert_close(predictions[:2], expected, depth=BN_DEPTH)
    for slot, variable in zip(model.stateful_slots, keras_model.non_trainable_variables):
        assert_close(updates[slot], variable, depth=BN_DEPTH)
    assert not np.allclose(updates[model.stateful_slots[1]], 1.0)


@pytest.mark.numeric
@pytest.mark.parametrize(
    'optimizer', [tff.learning.optimizers.build_sgdm(0.1), tff.learning.optimizers.build_adam(0.02)]
)
def test_lockstep_carries_batch_norm_statistics_as_the_per_client_loop_assigns_them(optimizer):
    sizes = (5, 2, 0, 7)  # Last batches of 2 and 1 examples, a client smaller than a batch, an empty one.
    data = bn_client_data(sizes)
    model = functional.FunctionalModel(bn_model, batch_norm=True)
    packer = packing.ClientPacker(lambda d: (d,), ('train',), data[0].element_spec, group_size=len(sizes))
    (group,) = packer.pack(data)
    slots = [(functional.GLOBAL_TRAINABLE, i) for i in range(len(model.initial_weights.global_trainable))]
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=True)
    def engine(group):
        initial = functional.Parts(*[[tf.constant(w) for w in part] for part in model.initial_weights])
        weights, _ = lockstep.lockstep_steps(model, initial, slots, group['train'], optimizer, loss)
        return weights

    weights = engine(tf.nest.map_structure(tf.convert_to_tensor, group))
    for c, dataset in enumerate(data):
        keras_model = bn_model()
        variables = keras_model.trainable_variables

        @tf.function
        def per_client(dataset):
            def step(state, batch):
                with tf.GradientTape() as tape:
                    batch_loss = loss(batch['y'], keras_model(batch['x'], training=True))
                state, updated = optimizer.next(state, tuple(variables), tuple(tape.gradient(batch_loss, variables)))
                for v, u in zip(variables, updated):
                    v.assign(u)
                return state

            specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in variables)
            return dataset.reduce(optimizer.initialize(specs), step)

        per_client(dataset)
        engine_values = list(weights.global_trainable) + list(weights.global_non_trainable)
        for engine_value, variable in zip(engine_values, variables + keras_model.non_trainable_variables):
            assert_close(engine_value[c], variable, depth=BN_DEPTH, steps=3)
    np.testing.assert_array_equal(weights.global_non_trainable[1][2], np.ones([2], np.float32))  # Empty: unmoved.


def test_engine_refuses_batch_norm_it_cannot_record():
    def renorm_model():
        return tf.keras.Sequential([tf.keras.Input([3]), tf.keras.layers.BatchNormalization(renorm=True)])

    with pytest.raises(errors.ConfigError, match='renorm'):
        functional.FunctionalModel(renorm_model, batch_norm=True)
    with pytest.raises(errors.ConfigError, match="BatchNormalization.*simulation='per_client'"):
        functional.FunctionalModel(bn_model)  # Models that do not carry their statistics refuse batch norm.
