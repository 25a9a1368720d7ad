"""FURL: split-personalization equivalence, privacy audit of the computations, stateful private parameters."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import models
from fedpersonal.algorithms import furl
from fedpersonal.core import client_work
from fedpersonal.models import matrix_factorization as mf
from fedpersonal.privacy import audit
from tests import tolerances

NUM_USERS, NUM_ITEMS, DIM = 4, 10, 3
RNG = np.random.default_rng(7)
ITEM_INIT = RNG.normal(0, 0.4, size=[NUM_ITEMS, DIM]).astype(np.float32)
USER_INIT = RNG.normal(0, 0.4, size=[NUM_USERS, DIM]).astype(np.float32)
LR_CLIENT = 0.1
# The longest chain of additions feeding an embedding in one step: the prediction's dot product (DIM), the batch's
# gradient sum (batches of 4) and the mean over a cohort of at most 4 clients.
DEPTH = DIM + 4 + 4


def _items():
    return tf.keras.layers.Embedding(
        NUM_ITEMS, DIM, embeddings_initializer=tf.keras.initializers.Constant(ITEM_INIT), name='ItemEmbedding'
    )


def furl_model_fn():
    item_input = tf.keras.Input(shape=[1], dtype=tf.int64)
    items, user = _items(), mf.UserEmbedding(DIM, name='UserEmbedding')
    pred = tf.keras.layers.Dot(axes=1)([tf.keras.layers.Flatten()(items(item_input)), user(item_input)])
    return models.from_keras_model(
        tf.keras.Model(item_input, pred),
        input_spec=mf.personal_input_spec(),
        global_layers=[items],
        local_layers=[user],
    )


def table_model_fn():
    user_input = tf.keras.Input(shape=[1], dtype=tf.int64, name='user_id')
    item_input = tf.keras.Input(shape=[1], dtype=tf.int64, name='item_id')
    items = _items()
    users = tf.keras.layers.Embedding(NUM_USERS, DIM, embeddings_initializer=tf.keras.initializers.Constant(USER_INIT))
    pred = tf.keras.layers.Dot(axes=1)(
        [tf.keras.layers.Flatten()(items(item_input)), tf.keras.layers.Flatten()(users(user_input))]
    )
    keras_model = tf.keras.Model(collections.OrderedDict(user_id=user_input, item_id=item_input), pred)
    return models.from_keras_model(keras_model, input_spec=mf.table_input_spec(), global_layers=[items, users])


def ratings(user):
    items = np.arange(user, user + 6) % NUM_ITEMS
    return items.astype(np.int64), (1.0 + (items * (user + 1)) % 5).astype(np.float32)


def furl_dataset(user):
    items, y = ratings(user)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=items[:, None], y=y[:, None])).batch(4)


def table_dataset(user):
    items, y = ratings(user)
    x = collections.OrderedDict(user_id=np.full([items.size, 1], user, np.int64), item_id=items[:, None])
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y[:, None])).batch(4)


def build_server_stored_process():
    """The same algorithm with user embeddings stored on the server: the whole user table is broadcast,
    each client trains its own row jointly with the item matrix, item updates are FedAvg-averaged and the
    table is aggregated by identity (each row takes its own user's trained value: a sum of disjoint deltas)."""
    with tf.Graph().as_default():
        spec = table_model_fn().input_spec

    @tff.tensorflow.computation
    def init():
        return [v.read_value() for v in table_model_fn().global_trainable_variables]

    weights_type = init.type_signature.result

    @tff.tensorflow.computation(weights_type, tff.SequenceType(tff.types.tensorflow_to_type(spec)))
    @tf.function
    def client(weights, dataset):
        with tf.init_scope():
            model = table_model_fn()
            variables = list(model.global_trainable_variables)
        client_work.assign(variables, weights)
        n = client_work.optimizer_steps(
            variables,
            dataset,
            tff.learning.optimizers.build_sgdm(LR_CLIENT),
            client_work.model_batch_loss(model, tf.keras.losses.MeanSquaredError()),
        ).num_examples
        items_delta, table_delta = [a - b for a, b in zip(weights, variables)]
        return items_delta, tf.cast(n, tf.float32), table_delta

    @tff.federated_computation(
        tff.FederatedType(weights_type, tff.SERVER), tff.FederatedType(client.type_signature.parameter[1], tff.CLIENTS)
    )
    def next_fn(weights, datasets):
        items_delta, weight, table_delta = tff.federated_map(client, (tff.federated_broadcast(weights), datasets))
        mean_items = tff.federated_mean(items_delta, weight)
        table_sum = tff.federated_sum(table_delta)

        @tff.tensorflow.computation(weights_type, mean_items.type_signature.member, table_sum.type_signature.member)
        def apply(w, d_items, d_table):
            return [w[0] - d_items, w[1] - d_table]

        return tff.federated_map(apply, (weights, mean_items, table_sum))

    return init, next_fn


@pytest.mark.numeric
def test_split_personalization_equivalence_round_by_round():
    """FURL (private embeddings on clients) == server-stored embeddings with identity aggregation."""
    process = furl.build_furl(
        furl_model_fn,
        loss_fn=tf.keras.losses.MeanSquaredError,
        client_optimizer=tff.learning.optimizers.build_sgdm(LR_CLIENT),
        server_optimizer=tff.learning.optimizers.build_sgdm(1.0),
    )
    init, server_next = build_server_stored_process()
    state = process.initialize()
    on_device = {
        u: tff.learning.models.ModelWeights(trainable=[USER_INIT[u : u + 1]], non_trainable=[])
        for u in range(NUM_USERS)
    }
    server_weights = init()
    np.testing.assert_array_equal(server_weights[0], ITEM_INIT)  # The same constant initializer.
    # Each round's client takes 2 steps (6 ratings in batches of 4); the ratings (up to 5) bound the errors' terms.
    steps, scale = 0, 5.0
    for cohort in ([0, 1, 2, 3], [0, 2], [1, 3], [3], [0, 1, 2, 3]):
        steps += 2
        out = process.run_round(state, [furl_dataset(u) for u in cohort], [on_device[u] for u in cohort])
        state = out.state
        for u, private in zip(cohort, out.private_states):
            on_device[u] = private
        server_weights = server_next(server_weights, [table_dataset(u) for u in cohort])
        tolerances.assert_reordered_close(
            process.get_model_weights(state).trainable[0], server_weights[0], depth=DEPTH, steps=steps, scale=scale
        )
        for u in range(NUM_USERS):
            tolerances.assert_reordered_close(
                on_device[u].trainable[0][0], server_weights[1][u], depth=DEPTH, steps=steps, scale=scale
            )
    bound = tolerances.reorder_bound(depth=DEPTH, steps=steps, scale=scale)
    assert np.abs(server_weights[1] - USER_INIT).max(axis=1).min() > 100 * bound  # Every user trained far beyond it.


def test_private_state_is_client_placed_input_and_output_only():
    process = furl.build_furl(furl_model_fn, loss_fn=tf.keras.losses.MeanSquaredError)
    signature = process.next.type_signature
    assert signature.parameter[2].placement is tff.CLIENTS
    assert signature.result.private_states.placement is tff.CLIENTS
    server_shapes = audit.tensor_shapes(signature.result.state, signature.result.metrics)
    assert (NUM_ITEMS, DIM) in server_shapes and (1, DIM) not in server_shapes


def test_privacy_audit_passes_furl_and_catches_leaks():
    engine = furl.build_furl(furl_model_fn, loss_fn=tf.keras.losses.MeanSquaredError, private_norm_regularization=0.01)
    assert engine.simulation == 'engine'
    assert audit.audit_private_dataflow(engine.next, private_parameter_index=2) == []  # The engine's round.
    process = furl.build_furl(
        furl_model_fn,
        loss_fn=tf.keras.losses.MeanSquaredError,
        private_norm_regularization=0.01,
        simulation='per_client',  # Its client datasets are sequences, which the leaks below read.
    )
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []

    params = process.next.type_signature.parameter
    private_type, dataset_type = params[2].member, params[1].member

    @tff.tensorflow.computation(private_type)
    def norm(private):
        return tf.reduce_sum(tf.square(private.trainable[0]))

    @tff.federated_computation(params[0], params[1], params[2])
    def leak_into_metrics(state, data, private):
        out = process.next(state, data, private)
        return out.state, tff.federated_sum(tff.federated_map(norm, private)), out.private_states

    @tff.federated_computation(params[0], params[1], params[2])
    def leak_into_state(state, data, private):
        out = process.next(state, data, private)
        leaked = tff.federated_mean(tff.federated_map(norm, private))
        return tff.federated_zip((out.state, leaked)), out.metrics, out.private_states

    # A leak hidden inside one client TF computation next to a legitimate data-derived output.
    @tff.tensorflow.computation(dataset_type, private_type)
    @tf.function
    def client_stats(dataset, private):
        total = dataset.reduce(tf.constant(0.0), lambda acc, batch: acc + tf.reduce_sum(batch['y']))
        return total, tf.reduce_sum(private.trainable[0])

    @tff.federated_computation(params[0], params[1], params[2])
    def hidden_leak(state, data, private):
        out = process.next(state, data, private)
        data_total, private_total = tff.federated_map(client_stats, (data, private))
        return (
            tff.federated_zip((out.state, tff.federated_sum(data_total))),
            tff.federated_sum(private_total),
            out.private_states,
        )

    @tff.federated_computation(params[0], params[1], params[2])
    def data_only(state, data, private):
        out = process.next(state, data, private)
        data_total, _ = tff.federated_map(client_stats, (data, private))
        return tff.federated_zip((out.state, tff.federated_sum(data_total))), out.metrics, out.private_states

    for leaky in (leak_into_metrics, leak_into_state, hidden_leak):
        violations = audit.audit_private_dataflow(leaky, private_parameter_index=2)
        assert violations, leaky
        assert any(v.where.startswith('federated_') for v in violations)
    assert audit.audit_private_dataflow(data_only, private_parameter_index=2) == []


def test_norm_regularization_shrinks_private_parameters():
    norms = {}
    for lam in (0.0, 1.0):
        process = furl.build_furl(
            furl_model_fn, loss_fn=tf.keras.losses.MeanSquaredError, private_norm_regularization=lam
        )
        state, private = (
            process.initialize(),
            [tff.learning.models.ModelWeights(trainable=[USER_INIT[0:1] * 10], non_trainable=[])],
        )
        for _ in range(3):
            out = process.run_round(state, [furl_dataset(0)], private)
            state, private = out.state, out.private_states
        norms[lam] = float(np.linalg.norm(private[0].trainable[0]))
    assert norms[1.0] < 0.7 * norms[0.0]


def test_requires_private_parameters():
    def all_global():
        model = furl_model_fn()
        return models.from_keras_model(
            model.keras_model,
            input_spec=model.input_spec,
            global_variables=model.global_trainable_variables + model.local_trainable_variables,
        )

    with pytest.raises(models.ModelSpecError, match='FURL needs a model with local trainable variables'):
        furl.build_furl(all_global, loss_fn=tf.keras.losses.MeanSquaredError)


def _client_data():
    def make(client_id):
        return furl_dataset(int(client_id)).unbatch()

    return tff.simulation.datasets.ClientData.from_clients_and_tf_fn([str(u) for u in range(NUM_USERS)], make)


def _run(tmp_path, name, total_rounds, store):
    from fedpersonal import program  # pylint: disable=g-import-not-at-top

    process = furl.build_furl(
        furl_model_fn,
        loss_fn=tf.keras.losses.MeanSquaredError,
        client_optimizer=tff.learning.optimizers.build_sgdm(LR_CLIENT),
    )
    state, _ = program.run_learning_process(
        process,
        client_data=_client_data(),
        dataset_fn=lambda d: d.batch(4),
        clients_per_round=2,
        total_rounds=total_rounds,
        outputs=program.ExperimentOutputs(str(tmp_path), name),
        seed=3,
        rounds_per_checkpoint=2,
        client_state_store=store,
        name=name,
    )
    return process, state


def test_stateful_loop_resumes_consistently_with_a_durable_store(tmp_path):
    from fedpersonal import client_state  # pylint: disable=g-import-not-at-top
    from fedpersonal import evaluation  # pylint: disable=g-import-not-at-top
    from fedpersonal import program  # pylint: disable=g-import-not-at-top

    spec = [((1, DIM), np.float32)]
    default = client_state.seeded_uniform_default(spec, scale=0.05, seed=0)
    ids = [str(u) for u in range(NUM_USERS)]

    with client_state.SqliteClientStateStore(str(tmp_path / 'straight.db'), spec, default) as store:
        process, straight = _run(tmp_path, 'straight', 4, store)
        expected_private = store.get(ids)
    with client_state.SqliteClientStateStore(str(tmp_path / 'resumed.db'), spec, default) as store:
        _run(tmp_path, 'resumed', 2, store)
        store.put(ids[:2], [[np.full((1, DIM), 99.0, np.float32)]] * 2, round_num=3)  # Crash before checkpoint 3.
    with client_state.SqliteClientStateStore(str(tmp_path / 'resumed.db'), spec, default) as store:
        _, resumed = _run(tmp_path, 'resumed', 4, store)  # Resumes from round 2, discarding the round-3 write.
        resumed_private = store.get(ids)
        assert store.committed_round() == 4
    # The same program on the same inputs from a state stored and read back: the same numbers, exactly.
    np.testing.assert_array_equal(
        process.get_model_weights(resumed).trainable[0], process.get_model_weights(straight).trainable[0]
    )
    for a, b in zip(expected_private, resumed_private):
        np.testing.assert_array_equal(a[0], b[0])

    # Resuming with a store that lost the checkpointed rounds' states (a fresh in-memory store) is refused.
    with (
        client_state.InMemoryClientStateStore(spec, default) as fresh_store,
        pytest.raises(program.ClientStatesLostError, match='round 4.*committed after round 0'),
    ):
        _run(tmp_path, 'resumed', 6, fresh_store)

    # StandardEval of seen users with their own private state beats the default for the same users.
    evaluate = evaluation.build_private_state_eval(furl_model_fn, loss_fn=tf.keras.losses.MeanSquaredError)
    datasets = [furl_dataset(u) for u in range(NUM_USERS)]
    weights = process.get_model_weights(straight)
    own = evaluate(
        weights, datasets, [tff.learning.models.ModelWeights(trainable=p, non_trainable=[]) for p in expected_private]
    )
    default_states = [tff.learning.models.ModelWeights(trainable=default(i), non_trainable=[]) for i in ids]
    fresh = evaluate(weights, datasets, default_states)
    assert own['eval']['loss'] < fresh['eval']['loss']
    assert own['per_client']['loss'].shape == (NUM_USERS,)
