"""FURL on the fast simulation engine: the per-client path's state, metrics and private states."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms import furl
from fedpersonal.models import matrix_factorization as mf
from tests import tolerances

NUM_ITEMS = 20
# Depth: a rating's 3 factors and 2 biases, a batch of 4's gradient sum, the mean over at most 5 clients (the text
# model's: TEXT_DEPTH). Steps: a client's 14 / 4 batches a round (and its private phase), 3 rounds.
DEPTH = 5 + 4 + 5
STEPS = 3 * 2 * 4
# The char model: 8 chars through a 3-unit LSTM (2 + 3 terms a gate, back through 8 steps), a 4-unit MLP, batch 4.
TEXT_DEPTH = 2 * 8 * (2 + 3) + 4 + 4 + 2 + 2


def datasets(sizes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        items = rng.integers(0, NUM_ITEMS, n).astype(np.int64)
        ratings = rng.integers(1, 6, n).astype(np.float32)
        out.append(
            tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=items[:, None], y=ratings[:, None])).batch(4)
        )
    return out


CONFIGS = {
    'sgd_norm_penalty': dict(client_optimizer=tff.learning.optimizers.build_sgdm(0.1), private_norm_regularization=0.1),
    'adam_two_epochs_uniform': dict(
        client_optimizer=tff.learning.optimizers.build_adam(0.02),
        client_epochs=2,
        client_weighting=tff.learning.ClientWeighting.UNIFORM,
    ),
}


def build(name, simulation, **extra):
    return furl.build_furl(
        mf.personal_model_fn(num_items=NUM_ITEMS, num_latent_factors=3, add_biases=True),
        loss_fn=tf.keras.losses.MeanSquaredError,
        metrics_fn=lambda: [tf.keras.metrics.MeanAbsoluteError(name='mae')],
        simulation=simulation,
        **CONFIGS[name],
        **extra,
    )


def run(process, cohorts, data):
    state = process.initialize()
    private = {c: process.initial_private_state() for c in range(len(data))}
    for cohort in cohorts:
        output = process.run_round(  # A round with a non-finite client goes on (its update left out).
            state,
            [data[c] for c in cohort],
            [private[c] for c in cohort],
            client_ids=[str(c) for c in cohort],
            non_finite='ignore',
        )
        state = output.state
        for c, p in zip(cohort, output.private_states):
            private[c] = p
    return process.get_model_weights(state), output.metrics, private


@pytest.mark.parametrize(
    'name', [pytest.param(n, marks=[pytest.mark.numeric] * (n == 'sgd_norm_penalty')) for n in sorted(CONFIGS)]
)
def test_furl_engine_equals_per_client_path(name):
    data = datasets((9, 2, 0, 14, 5))  # Unequal sizes, one smaller than a batch, one empty.
    cohorts = ([0, 1, 2, 3, 4], [3, 1], [0, 2, 4, 1])
    reference = run(build(name, 'per_client'), cohorts, data)
    process = build(name, 'engine', group_size=2)
    engine = run(process, cohorts, data)
    assert process.backend.round_runner.traces == 1  # Traced once for the experiment: cohorts of 5, 2 and 4 clients.
    for a, b in zip(tf.nest.flatten(engine[0]), tf.nest.flatten(reference[0])):
        tolerances.assert_reordered_close(a, b, depth=DEPTH, steps=STEPS)
    for c in reference[2]:
        for a, b in zip(tf.nest.flatten(engine[2][c]), tf.nest.flatten(reference[2][c])):
            tolerances.assert_reordered_close(a, b, depth=DEPTH, steps=STEPS)
    train_a, train_b = engine[1]['client_work']['train'], reference[1]['client_work']['train']
    for key in train_b:
        tolerances.assert_reordered_close(float(train_a[key]), float(train_b[key]), depth=DEPTH + 30, steps=STEPS)
    initial = build(name, 'per_client').initial_private_state()
    assert not np.allclose(reference[2][0].trainable[0], initial.trainable[0])  # Private embeddings trained.
    np.testing.assert_array_equal(engine[2][2].trainable[0], initial.trainable[0])  # The empty client's did not.


def test_non_finite_client_keeps_its_previous_private_state_and_is_dropped():
    data = datasets((8, 8))
    huge = tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=np.arange(8, dtype=np.int64)[:, None], y=np.full([8, 1], 3e38, np.float32))
    ).batch(4)
    data.insert(1, huge)
    engine = run(build('sgd_norm_penalty', 'engine'), ([0, 1, 2],), data)
    reference = run(build('sgd_norm_penalty', 'per_client'), ([0, 1, 2],), data)
    initial = build('sgd_norm_penalty', 'engine').initial_private_state()
    np.testing.assert_array_equal(engine[2][1].trainable[0], initial.trainable[0])
    for a, b in zip(tf.nest.flatten(engine[0]), tf.nest.flatten(reference[0])):
        tolerances.assert_reordered_close(a, b, depth=DEPTH, steps=STEPS)


def test_fixed_clip_dp_clips_each_logical_client_like_the_per_client_path():
    """FURL's global update under DP-FedAvg with a fixed clip: engine (groups of 2) = per-client path; the private
    embeddings never pass through the aggregator and train as without DP."""
    from fedpersonal.privacy import dp  # pylint: disable=g-import-not-at-top

    def aggregator(clip=0.02):
        return dp.build_dp_aggregator(noise_multiplier=0.7, clients_per_round=3, clip=clip, noise_seed=1)

    uniform = dict(client_weighting=tff.learning.ClientWeighting.UNIFORM)
    data = datasets((9, 2, 0, 14, 5))
    cohorts = ([0, 1, 2], [3, 1, 4], [0, 2, 4])
    reference = run(build('sgd_norm_penalty', 'per_client', model_aggregator=aggregator(), **uniform), cohorts, data)
    engine = run(
        build('sgd_norm_penalty', 'engine', group_size=2, model_aggregator=aggregator(), **uniform), cohorts, data
    )
    values = lambda result: tf.nest.flatten((result[0], [result[2][c] for c in sorted(result[2])]))
    for a, b in zip(values(engine), values(reference)):  # The clip's norm sums every global weight's square too.
        tolerances.assert_reordered_close(a, b, depth=DEPTH + NUM_ITEMS * 4, steps=STEPS)
    assert engine[1]['aggregator'] == reference[1]['aggregator']
    loose = run(
        build('sgd_norm_penalty', 'engine', group_size=2, model_aggregator=aggregator(clip=1e6), **uniform),
        cohorts,
        data,
    )
    assert not np.allclose(loose[0].trainable[0], engine[0].trainable[0], atol=1e-4)  # The clip binds.


def _text_datasets():
    """Two users whose texts differ in length: the model trims each batch's padding (`TrimPadding`), so their char
    sequences (and the char embedding's sparse gradient rows) have different lengths within one group."""
    from fedpersonal.models import furl_models

    rng = np.random.default_rng(3)
    out = []
    for n, length in ((6, 3), (5, 7)):
        chars = np.zeros([n, 8], np.int32)
        chars[:, :length] = rng.integers(2, 10, [n, length])
        x = collections.OrderedDict(
            user_id=np.arange(n, dtype=np.int64), chars=chars, features=rng.random([n, 2]).astype(np.float32)
        )
        out.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=rng.integers(0, 2, n))).batch(4))
    model_fn = furl_models.furl_model_fn(
        char_vocab_size=10,
        max_chars=8,
        num_features=2,
        num_classes=2,
        personalization='none',
        lstm_units=3,
        char_embedding_dim=2,
        mlp_units=(4,),
    )
    return model_fn, out


def test_fed_avg_engine_on_texts_of_unequal_length_equals_per_client_path():
    from fedpersonal import algorithms

    model_fn, data = _text_datasets()
    results = {}
    for simulation in ('per_client', 'engine'):
        process = algorithms.build_fed_avg(
            model_fn,
            loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            client_optimizer=tff.learning.optimizers.build_sgdm(0.5),
            simulation=simulation,
        )
        state = process.initialize()
        for _ in range(2):
            state = process.run_round(state, data, client_ids=['0', '1']).state
        results[simulation] = process.get_model_weights(state).trainable
    for a, b in zip(results['engine'], results['per_client']):  # 2 rounds of 2 batches.
        tolerances.assert_reordered_close(a, b, depth=TEXT_DEPTH, steps=4)
