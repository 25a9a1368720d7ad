"""The engine's communication measurement equals the per-client path's measured broadcast and aggregator.

On the MovieLens MF model (cheap to trace); the next-word LSTM with its local OOV table is measured both ways
end to end in tests/experiments/next_word_prediction_test.py.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal.algorithms import fed_recon
from fedpersonal.metrics import communication
from fedpersonal.models import matrix_factorization as mf

NUM_ITEMS = 30
SGD = tff.learning.optimizers.build_sgdm


def _datasets(sizes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        items = rng.integers(0, NUM_ITEMS, [n, 1]).astype(np.int64)
        ratings = rng.integers(1, 6, [n, 1]).astype(np.float32)
        out.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=items, y=ratings)).batch(4))
    return out


def _build(simulation, measure=True, **extra):
    model_fn = mf.personal_model_fn(num_items=NUM_ITEMS, num_latent_factors=3, add_biases=True)
    kwargs = dict(
        loss_fn=tf.keras.losses.MeanSquaredError,
        client_optimizer=SGD(0.1),
        reconstruction_optimizer=SGD(0.1),
        **extra,
    )
    if simulation == 'per_client' and measure:
        learn_local_init = extra.get('learn_local_init', False)
        kwargs.update(
            model_distributor=communication.build_measured_broadcast(
                fed_recon.server_weights_type(model_fn, learn_local_init)
            ),
            model_aggregator=communication.MeasuredAggregationFactory(),
        )
    elif measure:
        kwargs.update(measure_communication=True)
    return algorithms.build_fed_recon(model_fn, simulation=simulation, **kwargs)


def _round_metrics(process, datasets):
    ids = [str(i) for i in range(len(datasets))]
    return process.run_round(process.initialize(), datasets, client_ids=ids).metrics


def _assert_same_communication(engine, reference):
    for part in ('distributor', 'aggregator'):
        tf.nest.assert_same_structure(engine[part], reference[part])
        assert list(engine[part]) == list(reference[part])  # Same keys, same order.
        for a, b in zip(tf.nest.flatten(engine[part]), tf.nest.flatten(reference[part])):
            assert np.asarray(a).dtype == np.asarray(b).dtype
            np.testing.assert_array_equal(a, b)
    assert communication.communication_from_metrics(engine) == communication.communication_from_metrics(reference)


@pytest.mark.parametrize(
    'sizes, extra',
    [
        ((8, 3, 6), dict(group_size=2)),  # Two groups, the last padded with an empty slot (not a client).
        ((8, 5, 0), dict(group_size=2, learn_local_init=True)),  # An empty last client; the learned local init is sent.
    ],
)
def test_engine_communication_equals_the_measured_per_client_path(sizes, extra):
    datasets = _datasets(sizes)
    reference = _round_metrics(_build('per_client', **{k: v for k, v in extra.items() if k != 'group_size'}), datasets)
    engine = _round_metrics(_build('engine', **extra), datasets)
    _assert_same_communication(engine, reference)
    measured = communication.communication_from_metrics(engine)
    assert measured['clients'] == len(sizes)
    assert measured['scalars_up_per_client'] == measured['scalars_down_per_client'] + 1  # The update + its weight.
    assert measured['bytes_up_per_client'] == 4 * measured['scalars_up_per_client']


def test_engine_without_measurement_reports_no_communication():
    metrics = _round_metrics(_build('engine', measure=False, group_size=2), _datasets((4, 6)))
    assert communication.communication_from_metrics(metrics) == {}
    assert metrics['distributor'] == ()
