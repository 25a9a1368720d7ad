"""Ditto on the fast simulation engine: the per-client path's global model, personal models and metrics."""

import collections
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from fedpersonal import backends
from fedpersonal.algorithms import ditto
from tests import tolerances

SPEC = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))
# Depth: the 4-5-3 model's fan-ins (4 + 5), fan-outs (3 + 5), the batch norm's moments over 3 (twice), a batch of
# 3's gradient sum, the mean over at most 4 clients. Steps: a client's 11 / 3 batches, global and personal, 3 rounds.
DEPTH = 4 + 5 + 3 + 5 + 2 * 3 + 3 + 4
STEPS = 3 * 2 * 4


def model_fn():
    init = tf.keras.initializers.GlorotUniform
    return tf.keras.Sequential(
        [
            tf.keras.Input([4]),
            tf.keras.layers.Dense(5, 'relu', kernel_initializer=init(seed=1)),
            tf.keras.layers.Dense(3, kernel_initializer=init(seed=2)),
        ]
    )


def datasets(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [
        tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(
                x=rng.normal(size=[n, 4]).astype(np.float32), y=rng.integers(0, 3, n).astype(np.int32)
            )
        ).batch(3)
        for n in sizes
    ]


def bn_model_fn():
    init = tf.keras.initializers.GlorotUniform
    return tf.keras.Sequential(
        [
            tf.keras.Input([4]),
            # No bias before batch norm: its gradient is zero up to float noise, which Adam would amplify.
            tf.keras.layers.Dense(5, use_bias=False, kernel_initializer=init(seed=1)),
            tf.keras.layers.BatchNormalization(momentum=0.5),
            tf.keras.layers.ReLU(),
            tf.keras.layers.Dense(3, kernel_initializer=init(seed=2)),
        ]
    )


def run(simulation, data, *, tff_next=False, model=model_fn, **kwargs):
    """Three rounds; with `tff_next`, an engine process runs them with its TFF `next` instead of its round runner
    (as in a distributed runtime: the private states stacked per group by its backend's packer, and back)."""
    process = ditto.build_ditto(
        model,
        element_spec=SPEC,
        lam=0.3,
        client_epochs=2,
        personal_epochs=1,
        simulation=simulation,
        **kwargs,
    )
    run_round = process.run_round
    if tff_next:  # What the engine backend runs under a distributed runtime.
        run_round = lambda *args: process.backend.run_next(process, *args)
    state = process.initialize()
    personal = {c: process.initial_private_state() for c in range(len(data))}
    for cohort in ([0, 1, 2, 3], [2, 0], [3, 1, 0]):
        out = run_round(state, [data[c] for c in cohort], [personal[c] for c in cohort])
        state = out.state
        personal.update(zip(cohort, out.private_states))
    if simulation == 'engine' and not tff_next:
        assert process.backend.round_runner.traces == 1  # Traced once for the experiment, not per round or group.
    return process.get_model_weights(state), out.metrics['client_work']['train'], personal


@pytest.mark.numeric
def test_ditto_engine_equals_per_client_path():
    data = datasets((7, 2, 0, 11))  # Unequal, smaller than a batch, empty.
    engine = run('engine', data, group_size=2)
    reference = run('per_client', data)
    for a, b in zip(tf.nest.flatten(engine[0]), tf.nest.flatten(reference[0])):
        tolerances.assert_reordered_close(a, b, depth=DEPTH, steps=STEPS)
    for c in reference[2]:
        for a, b in zip(tf.nest.flatten(engine[2][c]), tf.nest.flatten(reference[2][c])):
            tolerances.assert_reordered_close(a, b, depth=DEPTH, steps=STEPS)
    for key, value in reference[1].items():
        tolerances.assert_reordered_close(
            float(engine[1][key]), float(value), depth=DEPTH + 20, steps=STEPS, err_msg=key
        )
    assert not np.allclose(reference[2][0].trainable[0], run('per_client', data)[2][2].trainable[0])


def test_ditto_engine_equals_per_client_path_with_batch_norm():
    """The personal copies' moving statistics are carried per client by the engine as the per-client path's Keras
    layers update them (the global model's are not uploaded, on either backend)."""
    data = datasets((7, 5, 4, 11))
    engine = run('engine', data, group_size=2, model=bn_model_fn)
    reference = run('per_client', data, model=bn_model_fn)
    for a, b in zip(tf.nest.flatten(engine[0]), tf.nest.flatten(reference[0])):
        tolerances.assert_reordered_close(a, b, depth=DEPTH, steps=STEPS)
    for c in reference[2]:
        for a, b in zip(tf.nest.flatten(engine[2][c]), tf.nest.flatten(reference[2][c])):
            tolerances.assert_reordered_close(a, b, depth=DEPTH, steps=STEPS)
    assert not np.allclose(reference[2][0].non_trainable[0], 0.0)  # The copy's moving mean moved.


def test_ditto_engine_next_in_tff_equals_its_round_runner():
    data = datasets((7, 2, 0, 11))
    runner = run('engine', data, group_size=2)
    tff_next = run('engine', data, group_size=2, tff_next=True)
    for a, b in zip(tf.nest.flatten(tff_next[0]), tf.nest.flatten(runner[0])):
        tolerances.assert_reordered_close(a, b, depth=DEPTH, steps=STEPS)
    assert sorted(tff_next[2]) == sorted(runner[2])
    for c in runner[2]:
        for a, b in zip(tf.nest.flatten(tff_next[2][c]), tf.nest.flatten(runner[2][c])):
            tolerances.assert_reordered_close(a, b, depth=DEPTH, steps=STEPS)
    for key, value in runner[1].items():
        tolerances.assert_reordered_close(
            float(tff_next[1][key]), float(value), depth=DEPTH + 20, steps=STEPS, err_msg=key
        )


def test_a_model_the_engine_cannot_run_falls_back_to_the_per_client_backend_saying_why():
    def bn_model():
        return tf.keras.Sequential(
            [tf.keras.Input([4]), tf.keras.layers.BatchNormalization(renorm=True), tf.keras.layers.Dense(3)]
        )

    with mock.patch.object(backends.logging, 'info') as log:
        process = ditto.build_ditto(bn_model, element_spec=SPEC)
    assert process.simulation == 'per_client'
    (message, *args), _ = log.call_args
    assert 'Ditto runs on the per-client backend' in message % tuple(args)
    assert 'plain BatchNormalization only' in message % tuple(args)
    data = datasets((5, 3))
    out = process.run_round(process.initialize(), data, [process.initial_private_state()] * 2)
    assert np.isfinite(out.metrics['client_work']['train']['personal_loss'])
