"""The engine's compiled loop over clients (`client_loop`), alone and spread over cores, runs every client plan as
the other backends do: the plan tests' own references (plain eager loops written there, the per-client backend)
with the engine pinned to it (``engine_strategy``); the fixed rule of ``'auto'`` and its bit-identical reruns; and the
round runner's measured choice of a strategy (``'measure'``)."""

import collections
import contextlib
import threading
from unittest import mock

import numpy as np
import pytest

from fedpersonal import backends
from fedpersonal import errors
from fedpersonal import models
from fedpersonal.program import config_parts
from fedpersonal.simulation import client_loop
from fedpersonal.simulation import driver
from fedpersonal.simulation import options
from tests import tolerances
from tests.algorithms import apfl_test
from tests.algorithms import fed_avg_test
from tests.algorithms import fed_recon_test
from tests.algorithms import fedbn_fedbabu_test
from tests.algorithms import fedper_fedrep_test
from tests.simulation import ditto_engine_test
from tests.simulation import furl_engine_test


def _pinned(request):
    """Every engine process built in the test runs its rounds with the client loop (spread: over 2 cores, 'x2')."""
    original, ran = driver.GroupRoundRunner.__call__, []

    def run(self, *args, **kwargs):
        ran.append(self.strategy)
        return original(self, *args, **kwargs)

    with (
        mock.patch.object(options, 'parallel_parts', return_value=2),
        mock.patch.object(driver.GroupRoundRunner, '__call__', run),
        backends.use('engine', strategy=request.param),
    ):
        yield request.param
    # An engine round ran, with the pinned strategy.
    assert ran and set(ran) <= {'client_loop', 'client_loop x2' if request.param == 'spread' else 'client_loop'}
    assert request.param == 'client_loop' or 'client_loop x2' in ran


# Split groups (the spread) where the parts' results are reassembled per client: a stateful plan's (Ditto's: its
# personal models), a dropped client's kept state, and FedAvg's sums; the other plans' arithmetic is the client loop's.
pinned = pytest.fixture(params=['client_loop', 'spread'], name='pinned')(_pinned)
# The client loop alone (the plan's arithmetic; a DP aggregator's groups are never split).
pinned_loop = pytest.fixture(params=['client_loop'], name='pinned_loop')(_pinned)


@pytest.mark.parametrize('name', ['fedper', 'fedrep'])
def test_fedper_and_fedrep_equal_a_plain_loop(pinned_loop, name):
    model = fedper_fedrep_test.model_fn()
    initial = (
        [v.numpy() for v in model.global_trainable_variables],
        [v.numpy() for v in model.local_trainable_variables],
    )
    fedper_fedrep_test.test_every_backend_equals_a_plain_loop(initial, name, 'engine')


def test_apfl_equals_a_plain_loop(pinned_loop):
    apfl_test.test_every_backend_equals_a_plain_loop('engine')


def test_ditto_equals_the_per_client_path(pinned):
    ditto_engine_test.test_ditto_engine_equals_per_client_path()


@pytest.mark.parametrize('name', sorted(furl_engine_test.CONFIGS))
def test_furl_equals_the_per_client_path(pinned_loop, name):
    furl_engine_test.test_furl_engine_equals_per_client_path(name)


def test_a_non_finite_client_is_dropped_and_keeps_its_private_state(pinned):
    furl_engine_test.test_non_finite_client_keeps_its_previous_private_state_and_is_dropped()


def test_fixed_clip_dp_clips_each_client(pinned_loop):
    furl_engine_test.test_fixed_clip_dp_clips_each_logical_client_like_the_per_client_path()


def test_fed_avg_equals_tff(pinned):
    fed_avg_test.test_fed_avg_equals_tff_weighted_fed_avg('engine')


def test_fed_recon_equals_tff_and_algorithm_1_by_hand(pinned_loop):
    fed_recon_test.test_round_matches_tff_reference_implementation('engine')
    fed_recon_test.test_one_round_matches_algorithm_1_by_hand()


def test_fed_recon_with_a_learned_local_default_equals_the_per_client_path(pinned_loop):
    users, items = fed_recon_test.true_factors(4, shared_user=True)
    data = [fed_recon_test.client_dataset(users[i], items) for i in range(4)]
    weights = {}
    for backend in ('engine', 'per_client'):
        with backends.use(backend):
            process = fed_recon_test.build(
                learn_local_init=True,
                jointly_train_locals=True,
                server_optimizer=fed_recon_test.SGD(learning_rate=1.0),
                client_optimizer=fed_recon_test.SGD(learning_rate=0.05),
                reconstruction_optimizer=fed_recon_test.SGD(learning_rate=0.3),
            )
        state = process.initialize()
        for cohort in (data[:3], data[1:]):
            state = process.run_round(state, cohort).state
        weights[backend] = process.get_model_weights(state)
    # Depth: a rating's dot product of fed_recon_test.DIM factors, a batch of 4's gradient sum, the mean over 3
    # clients; steps: a client's NUM_ITEMS / 4 batches, once reconstructing and once training, in 2 rounds.
    depth = fed_recon_test.DIM + 4 + 3
    steps = 2 * 2 * -(-fed_recon_test.NUM_ITEMS // 4)
    for a, b in zip(weights['engine'].trainable, weights['per_client'].trainable):
        tolerances.assert_reordered_close(a, b, depth=depth, steps=steps)


def test_fedbn_and_fedbabu_equal_a_plain_loop(pinned_loop):
    fedbn_fedbabu_test.test_fedbabu_equals_a_plain_loop_with_the_head_frozen_at_its_initial_values('engine')
    # FedBN as its test runs it, to float32 reassociation (the moving variances reach ~40). Depth: the dense
    # layers' fan-ins (DIM, HIDDEN), the batch norm's moments over a batch of 10 (twice), the backward fan-outs
    # (NUM_CLASSES, HIDDEN), the batch's gradient sum, the mean over the clients; steps: 40 / 10 a round, 2 rounds.
    test = fedbn_fedbabu_test
    arrays = test.client_arrays()
    process = test.build('fedbn', 'engine')
    state = process.initialize()
    initial = process.initial_private_state()
    shared = [np.asarray(v) for v in process.get_model_weights(state).trainable]
    bns = [([np.asarray(v) for v in initial.trainable], [np.asarray(v) for v in initial.non_trainable])]
    bns *= test.NUM_CLIENTS
    privates = [initial] * test.NUM_CLIENTS
    for _ in range(2):
        output = process.run_round(state, test.datasets(arrays), privates)
        state, privates = output.state, list(output.private_states)
        shared, bns = test.fedbn_reference_round(shared, bns, arrays)
    depth = test.DIM + test.HIDDEN + 2 * 10 + test.NUM_CLASSES + test.HIDDEN + 10 + test.NUM_CLIENTS
    bound = dict(depth=depth, steps=2 * 4)
    for got, want in zip(process.get_model_weights(state).trainable, shared):
        tolerances.assert_reordered_close(got, want, **bound)
    for got, (want_trainable, want_statistics) in zip(privates, bns):
        for g, w in zip(list(got.trainable) + list(got.non_trainable), want_trainable + want_statistics):
            tolerances.assert_reordered_close(g, w, **bound)


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match='strategy must be one of'):
        client_loop.phase_steps('sideways', None, None, [], None, None)
    with pytest.raises(ValueError, match='strategy must be one of'), backends.use('engine', strategy='sideways'):
        pass
    with pytest.raises(errors.ConfigError, match='engine_strategy must be one of'):
        client_loop.runs('fastest', None, parts=1, splittable=True)


def test_the_config_names_the_engine_strategies():
    assert config_parts.ENGINE_STRATEGIES == options.ENGINE_STRATEGIES


def test_auto_is_a_fixed_rule_of_the_model_and_the_cores():
    dense = mock.Mock(multiplies_matrices=True)
    lookups = mock.Mock(multiplies_matrices=False)
    runs = lambda strategy, model, parts=1, splittable=True: client_loop.runs(
        strategy, model, parts=parts, splittable=splittable
    )
    assert runs('auto', dense) == [('client_loop', 1)]
    assert runs('auto', dense, parts=2) == [('client_loop', 1)]  # Spread only on request (docs/ENGINE.md).
    assert runs('auto', lookups, parts=2) == [(client_loop.SPARSE_LOCKSTEP, 1)]
    assert runs('lockstep', dense, parts=2) == [('lockstep', 1)]
    assert runs('client_loop', lookups, parts=2) == [('client_loop', 1)]
    assert runs('measure', dense, parts=2) == [('lockstep', 1), ('client_loop', 1), ('client_loop', 2)]
    assert runs('measure', lookups) == [('lockstep', 1), ('client_loop', 1), (client_loop.SPARSE_LOCKSTEP, 1)]
    assert runs('spread', lookups, parts=2) == [('client_loop', 2)]
    assert (
        runs('spread', lookups, parts=1) == runs('spread', lookups, parts=2, splittable=False) == [('client_loop', 1)]
    )


def test_auto_runs_an_embedding_models_penalized_phases_in_the_client_loop():
    """Under 'auto' an embedding-only model's phases run the lockstep, except one with a proximal penalty (dense over
    every table the client trains: 4-5x slower in the lockstep, docs/ENGINE.md "Engine strategies")."""
    called = []
    with (
        mock.patch.object(client_loop.lockstep, 'lockstep_steps', lambda *a, **k: called.append('lockstep')),
        mock.patch.object(client_loop, 'client_loop_steps', lambda *a, **k: called.append('client_loop')),
    ):
        for penalty in (None, lambda values, centre: 0.0):
            client_loop.phase_steps(client_loop.SPARSE_LOCKSTEP, None, None, [], None, None, penalty=penalty)
        client_loop.phase_steps('lockstep', None, None, [], None, None, penalty=lambda values, centre: 0.0)
    assert called == ['lockstep', 'client_loop', 'lockstep']  # A pinned lockstep stays the lockstep.


def test_model_kinds_the_rule_reads():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from fedpersonal.models import matrix_factorization as mf  # pylint: disable=g-import-not-at-top
    from fedpersonal.simulation import functional  # pylint: disable=g-import-not-at-top

    assert not functional.FunctionalModel(mf.personal_model_fn(num_items=4, num_latent_factors=2)).multiplies_matrices
    for make in (
        lambda: tf.keras.layers.Dense(2),
        lambda: tf.keras.layers.Conv1D(2, 2),
        lambda: tf.keras.layers.LSTM(2),
    ):
        model = functional.FunctionalModel(lambda make=make: tf.keras.Sequential([tf.keras.Input([3, 2]), make()]))
        assert model.multiplies_matrices


@pytest.mark.numeric
def test_auto_reruns_are_bit_identical_and_equal_a_float64_loop(parts=2):
    """Two processes built alike under 'auto' (with 2 cores allowed) give the same bits, round after round."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    from fedpersonal import algorithms  # pylint: disable=g-import-not-at-top

    spec = collections.OrderedDict(x=tf.TensorSpec([None, 5], tf.float32), y=tf.TensorSpec([None], tf.int32))

    def model_fn():
        init = tf.keras.initializers.GlorotUniform
        keras = tf.keras.Sequential(
            [tf.keras.Input([5]), tf.keras.layers.Dense(3, kernel_initializer=init(1), bias_initializer='ones')]
        )
        return models.from_keras_model(keras, input_spec=spec, global_variables=keras.variables)

    rng = np.random.default_rng(1)
    arrays = [(rng.normal(size=[n, 5]).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)) for n in (7, 4, 9)]
    data = [tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(3) for x, y in arrays]
    runs = []
    with mock.patch.object(options, 'parallel_parts', return_value=parts):
        for _ in range(2):
            with backends.use('engine', strategy='auto'):
                process = algorithms.build_fed_avg(
                    model_fn,
                    loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    client_optimizer=tff.learning.optimizers.build_sgdm(0.3),
                )
            # 'auto' never spreads, whatever the cores; this model's phases are too small for the low-rank steps' gain
            # (`low_rank.fits`), so they run the client loop.
            assert process.engine_strategy == 'low_rank'
            state, weights = process.initialize(), []
            initial = [np.asarray(w, np.float64) for w in process.get_model_weights(state).trainable]
            for _ in range(3):
                state = process.run_round(state, data).state
                weights.append([np.asarray(w) for w in process.get_model_weights(state).trainable])
            runs.append(weights)
    for first, second in zip(*runs):
        for a, b in zip(first, second):
            np.testing.assert_array_equal(a, b)
    # The rounds by hand in float64: softmax cross-entropy, 0.3 SGD per batch, example-weighted mean of deltas.
    server = initial
    for r in range(3):
        total, sums = 0, [np.zeros_like(v) for v in server]
        for x, y in arrays:
            w = [v.copy() for v in server]
            for s in range(0, len(x), 3):
                xb, yb = x[s : s + 3].astype(np.float64), y[s : s + 3]
                logits = xb @ w[0] + w[1]
                p = np.exp(logits - logits.max(1, keepdims=True))
                p /= p.sum(1, keepdims=True)
                p[np.arange(len(yb)), yb] -= 1.0
                p /= len(yb)
                w = [w[0] - 0.3 * xb.T @ p, w[1] - 0.3 * p.sum(0)]
            sums = [t + len(x) * (a - b) for t, a, b in zip(sums, server, w)]
            total += len(x)
        server = [a - t / total for a, t in zip(server, sums)]
        # Depth: 5 inputs, the softmax's 3 logits, a batch of 3, the mean over 3 clients; at most 3 steps a round.
        for got, want in zip(runs[0][r], server):
            tolerances.assert_reordered_close(got, want, depth=5 + 3 + 3 + 3, steps=3 * (r + 1))


def test_parts_that_run_at_once_never_share_a_group_work():
    """A split group's parts run at once (a thread each); a group work's Keras metrics are variables that a call
    resets, updates and reads, so two parts sharing one mixed their metrics (Ditto's example counts 8236 for 5640).
    Here every call waits for a second one to be running, so parts overlap on every round, and each copy of the work
    must be in one call at a time; the round's metrics equal the unsplit round's."""
    barrier, busy, shared = threading.Barrier(2, timeout=60), set(), []
    original = driver.GroupRoundRunner.__init__

    def guarded(work):
        def call(*args):
            shared.extend([id(work)] if id(work) in busy else [])
            busy.add(id(work))
            try:
                barrier.wait()  # Both parts inside a work at once.
                return work(*args)
            finally:
                busy.discard(id(work))

        call.experimental_get_tracing_count = work.experimental_get_tracing_count
        return call

    def init(self, group_work, *args, **kwargs):
        copies = {name: [guarded(w) for w in works] for name, works in group_work.items()}
        original(self, copies, *args, **kwargs)

    data = ditto_engine_test.datasets([9, 4, 7, 12, 5, 8], seed=3)
    metrics = {}
    for strategy in ('client_loop', 'spread'):
        patches = [mock.patch.object(options, 'parallel_parts', return_value=2)]
        if strategy == 'spread':
            patches.append(mock.patch.object(driver.GroupRoundRunner, '__init__', init))
        with contextlib.ExitStack() as stack, backends.use('engine', strategy=strategy):
            for patch in patches:
                stack.enter_context(patch)
            process = ditto_engine_test.ditto.build_ditto(
                ditto_engine_test.model_fn, element_spec=ditto_engine_test.SPEC, lam=0.3, group_size=3
            )
            state, personal = process.initialize(), [process.initial_private_state()] * len(data)
            for _ in range(2):
                output = process.run_round(state, data, personal)
                state, personal = output.state, list(output.private_states)
            metrics[strategy] = output.metrics['client_work']['train']
            assert process.backend.round_runner.strategy == ('client_loop x2' if strategy == 'spread' else strategy)
    assert not shared
    # The same group work on the same groups, only run at once: the same bits.
    assert {k: float(v) for k, v in metrics['spread'].items()} == {
        k: float(v) for k, v in metrics['client_loop'].items()
    }


def test_each_strategy_is_timed_on_its_second_round_and_a_clearly_faster_one_runs_the_rest():
    choice = driver.StrategyChoice(['a', 'b', 'b x2'])
    order = []
    for seconds in (9.0, 2.0, 9.0, 1.0, 9.0, 0.9):  # Per strategy: a compiling round, then a timed one.
        order.append(choice.next())
        assert choice.chosen is None
        choice.record(order[-1], seconds)
    assert order == ['a', 'a', 'b', 'b', 'b x2', 'b x2']
    # 'b x2' is faster than 'b', but by less than the margin (1.2x): 'b', preferred, runs the rounds.
    assert choice.chosen == 'b' and choice.seconds == {'a': 2.0, 'b': 1.0, 'b x2': 0.9}
    assert [choice.next() for _ in range(3)] == ['b'] * 3
    assert driver.StrategyChoice(['only']).chosen == 'only'


def test_a_group_splits_into_parts_of_equal_size_and_about_equal_steps():
    from fedpersonal.simulation import packing  # pylint: disable=g-import-not-at-top

    steps = np.array([1, 9, 2, 8, 5])
    group = {'train': {'mask': steps[:, None], 'steps': steps, 'batch': {'x': np.arange(10).reshape(5, 2)}}}
    parts = packing.split_group(group, 2)
    assert [list(i) for _, i in parts] == [[0, 1, 2], [3, 4]]  # Steps 9 + 2 + 1 and 8 + 5: sizes 3 and 2.
    assert [list(p['train']['steps']) for p, _ in parts] == [[1, 9, 2], [8, 5]]
    assert [list(p['train']['batch']['x'][:, 0]) for p, _ in parts] == [[0, 2, 4], [6, 8]]
    assert len(packing.split_group(group, 9)) == 5


@pytest.mark.parametrize('kind', ['conv', 'dense'])
def test_long_phases_loop_over_steps_and_equal_the_per_client_path(pinned_loop, kind):
    """Clients of 0 to 11 steps (batch 2): more steps than are unrolled, a compiled loop over them; a convolutional
    model runs uncompiled (`FunctionalModel.xla`)."""
    import collections  # pylint: disable=g-import-not-at-top

    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    from fedpersonal import algorithms  # pylint: disable=g-import-not-at-top
    from fedpersonal import models  # pylint: disable=g-import-not-at-top

    shape = [6, 6, 1] if kind == 'conv' else [5]
    spec = collections.OrderedDict(x=tf.TensorSpec([None, *shape], tf.float32), y=tf.TensorSpec([None], tf.int32))

    def model_fn():
        init = tf.keras.initializers.GlorotUniform
        layers = [
            tf.keras.layers.Conv2D(3, 3, activation='relu', kernel_initializer=init(1)),
            tf.keras.layers.Flatten(),
        ]
        if kind == 'dense':
            layers = [tf.keras.layers.Dense(6, 'relu', kernel_initializer=init(1))]
        keras = tf.keras.Sequential(
            [tf.keras.Input(shape), *layers, tf.keras.layers.Dense(3, kernel_initializer=init(2))]
        )
        return models.from_keras_model(keras, input_spec=spec, global_variables=keras.variables)

    rng = np.random.default_rng(0)
    data = [
        tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(
                x=rng.normal(size=[n, *shape]).astype(np.float32), y=rng.integers(0, 3, n).astype(np.int32)
            )
        ).batch(2)
        for n in (21, 0, 9, 16)
    ]
    weights = {}
    for backend in ('engine', 'per_client'):
        with backends.use(backend):
            process = algorithms.build_fed_avg(
                model_fn,
                loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                client_optimizer=tff.learning.optimizers.build_sgdm(0.05, momentum=0.5),
            )
        state = process.initialize()
        for cohort in ([0, 1, 2], [3, 0, 2]):
            state = process.run_round(state, [data[c] for c in cohort]).state
        weights[backend] = process.get_model_weights(state).trainable
    # Depth: the 3x3 convolution's 9 terms and the dense layer's fan-in (4 x 4 x 3 = 48; the dense model's 5 and 6),
    # the backward pass's fan-outs (3 + 6), a batch of 2, the mean over 3 clients; at most 11 steps a round.
    depth = 9 + 48 + 3 + 6 + 2 + 3
    for a, b in zip(weights['engine'], weights['per_client']):
        tolerances.assert_reordered_close(a, b, depth=depth, steps=2 * 11)
