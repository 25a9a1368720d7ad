"""FedRecon: numeric equivalences, phase isolation, convergence, privacy of the type signatures."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import evaluation
from fedpersonal import models
from fedpersonal.core import client_work
from tests import tolerances

NUM_ITEMS = 12
DIM = 7  # Distinctive, so the user embedding's shape (1, 7) is recognisable in type signatures.
RNG = np.random.default_rng(0)
ITEM_INIT = RNG.normal(0.0, 0.3, size=[NUM_ITEMS, DIM]).astype(np.float32)


class ConstantUser(tf.keras.layers.Layer):
    def build(self, input_shape):
        self.embedding = self.add_weight(
            name='embedding', shape=(1, DIM), initializer=tf.keras.initializers.Constant(0.1)
        )

    def call(self, inputs):
        return tf.broadcast_to(self.embedding, [tf.shape(inputs)[0], DIM])


def deterministic_model_fn():
    item_input = tf.keras.Input(shape=[1], dtype=tf.int64)
    items = tf.keras.layers.Embedding(NUM_ITEMS, DIM, embeddings_initializer=tf.keras.initializers.Constant(ITEM_INIT))
    user = ConstantUser()
    pred = tf.keras.layers.Dot(axes=1)([tf.keras.layers.Flatten()(items(item_input)), user(item_input)])
    keras_model = tf.keras.Model(item_input, pred)
    spec = collections.OrderedDict(x=tf.TensorSpec([None, 1], tf.int64), y=tf.TensorSpec([None, 1], tf.float32))
    return models.from_keras_model(keras_model, input_spec=spec, global_layers=[items], local_layers=[user])


def true_factors(num_users, seed=1, shared_user=False, rank=2):
    """Rank-`rank` ground truth (the model has DIM >= rank latent dimensions)."""
    rng = np.random.default_rng(seed)
    users = np.zeros([num_users, DIM])
    items = np.zeros([NUM_ITEMS, DIM])
    users[:, :rank] = rng.normal(0, 1.0, size=[num_users, rank])
    items[:, :rank] = rng.normal(0, 1.0, size=[NUM_ITEMS, rank])
    if shared_user:
        users[:] = users[0]
    return users, items


def client_dataset(user_vec, item_matrix, items=None, batch=4):
    items = np.arange(NUM_ITEMS) if items is None else np.asarray(items)
    ratings = (item_matrix[items] @ user_vec).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(x=items.astype(np.int64)[:, None], y=ratings[:, None])
    ).batch(batch)


SGD = tff.learning.optimizers.build_sgdm

# The longest chain of additions feeding an item embedding in one step: the prediction's dot product (DIM), the
# batch's gradient sum (batches of 4) and the mean over the round's 3 clients.
DEPTH = DIM + 4 + 3


def build(**kwargs):
    kwargs.setdefault('loss_fn', tf.keras.losses.MeanSquaredError)
    return algorithms.build_fed_recon(deterministic_model_fn, **kwargs)


@pytest.mark.numeric
@pytest.mark.parametrize('simulation', ['per_client', 'engine'])
def test_round_matches_tff_reference_implementation(simulation):
    """Same model, optimizers and split function: identical global weights to TFF 0.87's build_fed_recon, on
    both backends (the one client plan each runs)."""
    split = algorithms.ReconstructionSplit(recon_epochs=2, recon_steps_max=5, post_recon_steps_max=3)
    split_fn = algorithms.build_dataset_split_fn(split)
    opts = dict(server=SGD(learning_rate=0.7), client=SGD(learning_rate=0.2), recon=SGD(learning_rate=0.3))
    ours = build(
        server_optimizer=opts['server'],
        client_optimizer=opts['client'],
        reconstruction_optimizer=opts['recon'],
        dataset_split=split,
        simulation=simulation,
    )
    assert ours.simulation == simulation
    reference = tff.learning.algorithms.build_fed_recon(
        deterministic_model_fn,
        loss_fn=tf.keras.losses.MeanSquaredError,
        server_optimizer_fn=opts['server'],
        client_optimizer_fn=opts['client'],
        reconstruction_optimizer_fn=opts['recon'],
        dataset_split_fn=split_fn,
    )
    users, items = true_factors(3)
    data = [client_dataset(users[i], items, items=np.arange(3 + 3 * i)) for i in range(3)]
    state_a, state_b = ours.initialize(), reference.initialize()
    for _ in range(2):
        state_a = ours.run_round(state_a, data).state
        state_b = reference.next(state_b, data).state
    a = ours.get_model_weights(state_a).trainable[0]
    b = reference.get_model_weights(state_b).trainable[0]
    # 2 rounds of at most 5 reconstruction and 3 update steps, each feeding the next.
    steps = 2 * (5 + 3)
    bound = tolerances.reorder_bound(depth=DEPTH, scale=tolerances.magnitude(a, b), steps=steps)
    assert np.abs(a - ITEM_INIT).max() > 100 * bound  # The rounds moved the items far beyond the bound.
    tolerances.assert_reordered_close(a, b, depth=DEPTH, steps=steps)


@pytest.mark.numeric
def test_one_round_matches_algorithm_1_by_hand():
    """k_r = k_u = 1 on one client, support = first half (strategy='order'): closed-form SGD steps."""
    lr_r, lr_c, lr_s = 0.3, 0.2, 0.5
    split = algorithms.ReconstructionSplit(strategy='order', recon_steps_max=1, post_recon_steps_max=1)
    process = build(
        server_optimizer=SGD(learning_rate=lr_s),
        client_optimizer=SGD(learning_rate=lr_c),
        reconstruction_optimizer=SGD(learning_rate=lr_r),
        dataset_split=split,
    )
    users, items = true_factors(1)
    item_ids = np.array([3, 5, 8, 9, 3, 1])
    ratings = (items[item_ids] @ users[0]).astype(np.float32)
    state = process.run_round(process.initialize(), [client_dataset(users[0], items, item_ids, batch=3)]).state
    # Reconstruction: one step on the support batch (first 3 examples), items frozen.
    q, u = ITEM_INIT.astype(np.float64), np.full(DIM, 0.1)
    s_items, s_r = item_ids[:3], ratings[:3]
    err = q[s_items] @ u - s_r
    u = u - lr_r * (2.0 / 3) * (err[:, None] * q[s_items]).sum(0)
    # Update: one step on the query batch (last 3), user frozen.
    q_items, q_r = item_ids[3:], ratings[3:]
    err = q[q_items] @ u - q_r
    grad = np.zeros_like(q)
    np.add.at(grad, q_items, (2.0 / 3) * err[:, None] * u[None, :])
    delta = lr_c * grad  # g_initial - g_final
    expected = q - lr_s * delta
    # Against float64: float32 rounding along the two steps' dot products (DIM) and batch sums (3 each), and the
    # half-dozen products by learning rates and 2/3; the values (and the ratings in the errors) are O(1).
    bound = tolerances.reorder_bound(depth=2 * (DIM + 3) + 6, scale=tolerances.magnitude(expected))
    assert np.abs(expected - q).max() > 100 * bound  # The round's step is far above the bound.
    np.testing.assert_allclose(process.get_model_weights(state).trainable[0], expected, rtol=0, atol=bound)


def test_reconstruction_changes_only_locals_and_update_only_globals():
    model = deterministic_model_fn()
    users, items = true_factors(1)
    data = client_dataset(users[0], items)
    loss = tf.keras.losses.MeanSquaredError()
    snapshot = lambda vs: [v.numpy().copy() for v in vs]

    @tf.function
    def steps(variables):
        opt = tff.learning.optimizers.build_sgdm(learning_rate=0.1)
        return client_work.optimizer_steps(variables, data, opt, client_work.model_batch_loss(model, loss))

    g0, l0 = snapshot(model.global_trainable_variables), snapshot(model.local_trainable_variables)
    steps(model.local_trainable_variables)
    g1, l1 = snapshot(model.global_trainable_variables), snapshot(model.local_trainable_variables)
    np.testing.assert_array_equal(g0[0], g1[0])
    assert not np.allclose(l0[0], l1[0])
    steps(model.global_trainable_variables)
    g2, l2 = snapshot(model.global_trainable_variables), snapshot(model.local_trainable_variables)
    np.testing.assert_array_equal(l1[0], l2[0])
    assert not np.allclose(g1[0], g2[0])


def test_zero_update_steps_leave_globals_untouched():
    process = build(dataset_split=algorithms.ReconstructionSplit(post_recon_steps_max=0))
    users, items = true_factors(2)
    state = process.run_round(process.initialize(), [client_dataset(users[i], items) for i in range(2)]).state
    np.testing.assert_array_equal(process.get_model_weights(state).trainable[0], ITEM_INIT)


def _shapes_in_type(type_spec, found):
    if isinstance(type_spec, tff.FederatedType):
        _shapes_in_type(type_spec.member, found)
    elif isinstance(type_spec, tff.SequenceType):
        _shapes_in_type(type_spec.element, found)
    elif isinstance(type_spec, tff.StructType):
        for _, member in tff.structure.iter_elements(type_spec):
            _shapes_in_type(member, found)
    elif isinstance(type_spec, tff.TensorType):
        found.add(tuple(type_spec.shape))
    elif isinstance(type_spec, tff.FunctionType):
        if type_spec.parameter is not None:
            _shapes_in_type(type_spec.parameter, found)
        _shapes_in_type(type_spec.result, found)
    return found


def test_privacy_local_variables_never_appear_in_server_or_client_result_types():
    local_shape = (1, DIM)
    process = build()
    shapes = _shapes_in_type(process.next.type_signature, set()) | _shapes_in_type(
        process.initialize.type_signature, set()
    )
    assert (NUM_ITEMS, DIM) in shapes  # The walker does see tensors...
    assert local_shape not in shapes  # ...but nothing shaped like the user embedding crosses the boundary.
    # Positive control: with a learned local default, the (aggregated) default is server state.
    leaky = build(learn_local_init=True)
    assert local_shape in _shapes_in_type(leaky.next.type_signature, set())


def test_convergence_and_recon_eval_on_a_known_low_rank_problem():
    users, items = true_factors(24)
    train = [client_dataset(users[i], items, batch=3) for i in range(20)]
    held_out = [client_dataset(users[i], items, batch=3) for i in range(20, 24)]
    split = algorithms.ReconstructionSplit(recon_epochs=10, recon_steps_max=20)
    process = build(
        server_optimizer=SGD(learning_rate=1.0),
        client_optimizer=SGD(learning_rate=0.1),
        reconstruction_optimizer=SGD(learning_rate=0.3),
        dataset_split=split,
    )
    recon_eval = evaluation.build_recon_eval(
        deterministic_model_fn,
        loss_fn=tf.keras.losses.MeanSquaredError,
        reconstruction_optimizer=SGD(learning_rate=0.3),
        dataset_split=split,
    )
    state = process.initialize()
    before = recon_eval(process.get_model_weights(state), held_out)['eval']['loss']
    rng = np.random.default_rng(0)
    for _ in range(40):
        state = process.run_round(state, [train[i] for i in rng.choice(20, 8, replace=False)]).state
    after = recon_eval(process.get_model_weights(state), held_out)
    variance = np.var(np.concatenate([[float(y) for b in d for y in b['y'].numpy().ravel()] for d in held_out]))
    assert after['eval']['loss'] < 0.25 * before
    assert after['eval']['loss'] < 0.25 * variance  # Far better than predicting the mean rating.
    assert after['per_client']['loss'].shape == (4,)


def test_learned_local_init_helps_clients_that_cannot_reconstruct():
    users, items = true_factors(12, shared_user=True)
    data = [client_dataset(users[i], items) for i in range(12)]
    no_recon = algorithms.ReconstructionSplit(recon_steps_max=0)
    results = {}
    for learn in (False, True):
        process = build(
            learn_local_init=learn,
            server_optimizer=SGD(learning_rate=1.0),
            client_optimizer=SGD(learning_rate=0.05),
            jointly_train_locals=True,
            reconstruction_optimizer=SGD(learning_rate=0.3),
            dataset_split=algorithms.ReconstructionSplit(recon_epochs=5, recon_steps_max=10),
        )
        state = process.initialize()
        for _ in range(25):
            state = process.run_round(state, data[:8]).state
        eval_fn = evaluation.build_recon_eval(
            deterministic_model_fn,
            loss_fn=tf.keras.losses.MeanSquaredError,
            dataset_split=no_recon,
            learn_local_init=learn,
        )
        results[learn] = eval_fn(process.get_model_weights(state), data[8:])['eval']['loss']
    assert results[True] < 0.5 * results[False]


def test_any_aggregator_and_server_optimizer_plug_in():
    users, items = true_factors(2)
    data = [client_dataset(users[i], items) for i in range(2)]
    dp = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=0.01, clients_per_round=2, clip=1.0
    )
    process = build(
        model_aggregator=dp,
        client_weighting=tff.learning.ClientWeighting.UNIFORM,
        server_optimizer=tff.learning.optimizers.build_yogi(learning_rate=0.01),
        simulation='engine',  # Adaptive DP runs on the per-client backend (tests/simulation/engine_test.py).
    )
    assert process.simulation == 'per_client'
    output = process.run_round(process.initialize(), data)
    weights = process.get_model_weights(output.state).trainable[0]
    assert np.all(np.isfinite(weights)) and not np.allclose(weights, ITEM_INIT)
    assert 'dp' in str(output.metrics['aggregator']) or output.metrics['aggregator'] is not None
    with pytest.raises(ValueError, match='UNIFORM'):
        build(model_aggregator=tff.aggregators.UnweightedMeanFactory(), simulation='per_client')


def test_model_without_globals_is_rejected_with_a_clear_error():
    def all_local():
        model = deterministic_model_fn()
        return models.from_keras_model(
            model.keras_model,
            input_spec=model.input_spec,
            local_variables=model.global_trainable_variables + model.local_trainable_variables,
        )

    with pytest.raises(models.ModelSpecError, match='FedRecon needs a model with global trainable variables'):
        algorithms.build_fed_recon(all_local, loss_fn=tf.keras.losses.MeanSquaredError)
