"""Clients without evaluation examples (no ratings at all, or a single rating that the support/query split puts in
the support set) are left out of the per-client distributions and counted, never scored 0: the per-client
quantiles of a population with such clients equal those of the population without them, on both evaluation paths.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import evaluation
from fedpersonal import metrics
from fedpersonal.models import matrix_factorization as mf
from tests import tolerances

NUM_ITEMS = 10
SIZES = (5, 8, 13)  # Clients with query examples.
EMPTY_SIZES = (1, 0, 1)  # A single rating (all support) or none: no query examples.
# A client's evaluation in another group of clients (the engine vectorizes over them: other shapes, maybe other
# kernels): the prediction's dot product of 2 factors and 2 biases, a batch's gradient sum (batches of 4), through at
# most 4 reconstruction steps (2 epochs of at most 2 support batches); a per-client metric then adds its (at most 13)
# query examples, and the root's rounding; the aggregate adds all clients' (at most 26).
DEPTH, STEPS = 2 + 2 + 4, 2 * 2
CLIENT_METRIC_DEPTH, METRIC_DEPTH = DEPTH + 13 + 1, DEPTH + sum(SIZES) + 1


def _client(num_examples, seed):
    rng = np.random.default_rng(seed)
    items = rng.integers(0, NUM_ITEMS, size=num_examples).astype(np.int64)
    ratings = rng.integers(1, 6, size=num_examples).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=items[:, None], y=ratings[:, None])).batch(4)


@pytest.mark.parametrize('simulation', ['engine', 'per_client'])
def test_clients_without_query_examples_are_excluded_and_counted(simulation):
    model_fn = mf.personal_model_fn(NUM_ITEMS, num_latent_factors=2, add_biases=True, seed=0)
    evaluate = evaluation.build_recon_eval(
        model_fn,
        loss_fn=tf.keras.losses.MeanSquaredError,
        metrics_fn=metrics.rating_metrics_fn(),
        reconstruction_optimizer=tff.learning.optimizers.build_sgdm(0.3),
        dataset_split=algorithms.ReconstructionSplit(recon_epochs=2),
        simulation=simulation,
    )
    model = model_fn()
    weights = tff.learning.models.ModelWeights(
        trainable=[v.numpy() for v in model.global_trainable_variables],
        non_trainable=[v.numpy() for v in model.global_non_trainable_variables],
    )
    with_examples = [_client(n, seed=i) for i, n in enumerate(SIZES)]
    without_examples = [_client(n, seed=10 + i) for i, n in enumerate(EMPTY_SIZES)]
    mixed = with_examples[:1] + without_examples + with_examples[1:]  # Empty clients in the middle of the order.

    reference = evaluate(weights, with_examples)
    result = evaluate(weights, mixed)
    assert len(result['per_client']['rmse']) == len(mixed)
    assert np.count_nonzero(np.asarray(result['per_client']['num_examples']) == 0) == len(EMPTY_SIZES)
    # Keras scores a client without examples 0: the raw per-client RMSEs have zeros, the summary ignores them.
    assert np.count_nonzero(np.asarray(result['per_client']['rmse']) == 0.0) >= len(EMPTY_SIZES)
    summary = metrics.summarize_per_client(result['per_client'])
    expected = metrics.summarize_per_client(reference['per_client'])
    for name in ('rmse', 'loss', 'mae'):
        if name not in expected:
            continue
        assert summary[name]['clients'] == len(SIZES) and summary[name]['clients_without_examples'] == len(EMPTY_SIZES)
        assert expected[name]['clients_without_examples'] == 0
        for stat in ('mean', 'std', 'min', 'p10', 'p25', 'p50', 'p75', 'p90', 'max'):
            # A mean, standard deviation or quantile of 3 values moves by at most their largest change.
            tolerances.assert_reordered_close(
                summary[name][stat],
                expected[name][stat],
                depth=CLIENT_METRIC_DEPTH + 3,
                steps=STEPS,
                err_msg=f'{name} {stat}',
            )
        assert summary[name]['min'] > 0.0  # No client scored 0.
    # The aggregate metrics are example-weighted, so clients without examples do not move them either.
    for name, value in reference['eval'].items():
        tolerances.assert_reordered_close(result['eval'][name], value, depth=METRIC_DEPTH, steps=STEPS, err_msg=name)


def test_every_client_without_examples():
    summary = metrics.summarize_per_client({'rmse': [0.0, 0.0], 'num_examples': [0, 0]})
    assert summary['rmse'] == {'clients': 0, 'clients_without_examples': 2}
    assert summary['num_examples']['clients_without_examples'] == 2
