"""StandardEval equals a direct computation; ReconEval reconstructs; per-client metrics are kept."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import evaluation
from fedpersonal import metrics
from fedpersonal.models import matrix_factorization as mf
from tests import tolerances


def _table_model_fn():
    from fedpersonal import models  # pylint: disable=g-import-not-at-top

    keras_model = mf.table_keras_model(4, 6, 3, add_biases=True)
    return models.from_keras_model(
        keras_model, input_spec=mf.table_input_spec(), global_variables=keras_model.trainable_variables
    )


def test_standard_eval_equals_direct_computation():
    rng = np.random.default_rng(0)
    keras_model = mf.table_keras_model(4, 6, 3, add_biases=True)
    for v in keras_model.trainable_variables:
        v.assign(rng.normal(0, 1, size=v.shape).astype(np.float32))
    weights = tff.learning.models.ModelWeights(
        trainable=[v.numpy() for v in keras_model.trainable_variables], non_trainable=[]
    )
    clients, all_err = [], []
    for user in range(4):
        items = rng.choice(6, size=3 + user, replace=False)
        ratings = rng.integers(1, 6, size=items.size).astype(np.float32)
        x = collections.OrderedDict(
            user_id=np.full([items.size, 1], user, np.int64), item_id=items[:, None].astype(np.int64)
        )
        pred = keras_model(x).numpy().ravel()
        all_err.append(pred - ratings)
        clients.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=ratings[:, None])).batch(2))
    computation = evaluation.build_standard_eval(
        _table_model_fn, loss_fn=tf.keras.losses.MeanSquaredError, metrics_fn=metrics.rating_metrics_fn()
    )
    result = computation(weights, clients)
    err = np.concatenate(all_err)
    # A prediction in batches of 2 against the whole client's (another shape): the dot product of 3 factors and the
    # 2 biases; a metric adds it over the 18 examples (a client's 3 to 6), with the square and root's roundings.
    depth, client_depth = 3 + 2 + err.size + 2, 3 + 2 + 6 + 2
    tolerances.assert_reordered_close(result['eval']['rmse'], np.sqrt(np.mean(err**2)), depth=depth)
    tolerances.assert_reordered_close(result['eval']['mae'], np.mean(np.abs(err)), depth=depth)
    # The count of errors within 0.5 is exact (unless an error sat within rounding of 0.5), its float32 quotient
    # rounded once.
    assert result['eval']['accuracy'] == pytest.approx(np.mean(np.abs(err) <= 0.5), rel=tolerances.U32)
    assert result['eval']['num_examples'] == err.size
    per_client_rmse = sorted(np.sqrt(np.mean(e**2)) for e in all_err)
    tolerances.assert_reordered_close(sorted(result['per_client']['rmse']), per_client_rmse, depth=client_depth)
    summary = metrics.summarize_per_client(result['per_client'])
    assert summary['rmse']['clients'] == 4
    tolerances.assert_reordered_close(summary['rmse']['p50'], np.median(per_client_rmse), depth=client_depth + 1)


def test_rating_accuracy_definition():
    metric = metrics.RatingAccuracy()
    metric.update_state(tf.constant([[4.0], [3.0], [5.0], [1.0]]), tf.constant([[4.4], [3.6], [4.5], [2.0]]))
    assert float(metric.result()) == 0.5  # |err| <= 0.5 for 4.4 and 4.5 only.
