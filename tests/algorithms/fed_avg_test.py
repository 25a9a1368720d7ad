"""FedAvg as FedRecon's special case equals TFF's build_weighted_fed_avg, per client and on the engine."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import models
from fedpersonal.models import matrix_factorization as mf
from tests import tolerances

pytestmark = pytest.mark.numeric

USERS, ITEMS, DIM = 6, 15, 4
# The longest chain of additions feeding an embedding in one step: the prediction's dot product (DIM), the batch's
# gradient sum (batches of 4: one user's row gets all 4) and the mean over a round's (at most 4) clients.
DEPTH = DIM + 4 + 4
# 4 rounds of at most 4 steps (14 ratings in batches of 4); the errors' terms reach the ratings' 5.
STEPS, SCALE = 4 * 4, 5.0


def _keras():
    return mf.table_keras_model(USERS, ITEMS, DIM, seed=3)


def _model_fn():
    keras_model = _keras()
    return models.from_keras_model(
        keras_model, input_spec=mf.table_input_spec(), global_variables=keras_model.variables
    )


def _tff_model_fn():
    return tff.learning.models.from_keras_model(
        _keras(), loss=tf.keras.losses.MeanSquaredError(), input_spec=mf.table_input_spec()
    )


def _client(user, n, seed):
    rng = np.random.default_rng(seed)
    data = collections.OrderedDict(
        x=collections.OrderedDict(
            user_id=np.full([n, 1], user, np.int64), item_id=rng.integers(0, ITEMS, [n, 1]).astype(np.int64)
        ),
        y=rng.integers(1, 6, [n, 1]).astype(np.float32),
    )
    return tf.data.Dataset.from_tensor_slices(data).batch(4)


# Unequal clients, one smaller than a batch.
CLIENTS = [_client(u, n, u) for u, n in enumerate([9, 3, 14, 6])]


@pytest.mark.parametrize('simulation', ['per_client', 'engine'])
def test_fed_avg_equals_tff_weighted_fed_avg(simulation):
    sgd = tff.learning.optimizers.build_sgdm
    reference = tff.learning.algorithms.build_weighted_fed_avg(
        _tff_model_fn, client_optimizer_fn=sgd(0.3), server_optimizer_fn=sgd(0.9)
    )
    process = algorithms.build_fed_avg(
        _model_fn,
        loss_fn=tf.keras.losses.MeanSquaredError,
        client_optimizer=sgd(0.3),
        server_optimizer=sgd(0.9),
        simulation=simulation,
    )
    expected, state = reference.initialize(), process.initialize()
    for round_num in range(4):
        clients = CLIENTS[round_num % 2 :]
        expected = reference.next(expected, clients).state
        state = process.run_round(state, clients, client_ids=[str(i) for i in range(round_num % 2, len(CLIENTS))]).state
    want, got = reference.get_model_weights(expected).trainable, process.get_model_weights(state).trainable
    moved = max(
        float(np.abs(a - b).max()) for a, b in zip(want, reference.get_model_weights(reference.initialize()).trainable)
    )
    # Training moved the weights far beyond the bound, so equality below is not trivial.
    assert moved > 100 * tolerances.reorder_bound(depth=DEPTH, steps=STEPS, scale=SCALE)
    for a, b in zip(want, got):
        tolerances.assert_reordered_close(b, a, depth=DEPTH, steps=STEPS, scale=SCALE)


def test_fed_avg_refuses_models_with_local_variables():
    with pytest.raises(models.ModelSpecError, match='all global'):
        algorithms.build_fed_avg(
            mf.personal_model_fn(num_items=ITEMS, num_latent_factors=DIM), loss_fn=tf.keras.losses.MeanSquaredError
        )
