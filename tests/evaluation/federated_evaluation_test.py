"""StandardEval equals a direct computation; ReconEval reconstructs; per-client metrics are kept."""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import evaluation
from fedpersonal import metrics
from fedpersonal.models import matrix_factorization as mf


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
    np.testing.assert_allclose(result['eval']['rmse'], np.sqrt(np.mean(err**2)), rtol=1e-5)
    np.testing.assert_allclose(result['eval']['mae'], np.mean(np.abs(err)), rtol=1e-5)
    np.testing.assert_allclose(result['eval']['accuracy'], np.mean(np.abs(err) <= 0.5), rtol=1e-6)
    assert result['eval']['num_examples'] == err.size
    per_client_rmse = sorted(np.sqrt(np.mean(e**2)) for e in all_err)
    np.testing.assert_allclose(sorted(result['per_client']['rmse']), per_client_rmse, rtol=1e-5)
    summary = metrics.summarize_per_client(result['per_client'])
    assert summary['rmse']['clients'] == 4
    np.testing.assert_allclose(summary['rmse']['p50'], np.median(per_client_rmse), rtol=1e-5)


def test_rating_accuracy_definition():
    metric = metrics.RatingAccuracy()
    metric.update_state(tf.constant([[4.0], [3.0], [5.0], [1.0]]), tf.constant([[4.4], [3.6], [4.5], [2.0]]))
    assert float(metric.result()) == 0.5  # |err| <= 0.5 for 4.4 and 4.5 only.
