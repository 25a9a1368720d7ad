"""Engine workers (Ray actors running the engine's compiled group programs): same results as the local engine,
private states back to their own clients, a dead worker named, the worker's program audited."""

import functools
import json
import os
import signal

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal import runtime
from fedpersonal.algorithms import furl
from fedpersonal.algorithms import hpfl
from fedpersonal.core import process as process_lib
from fedpersonal.privacy import audit
from fedpersonal.privacy import dp
from fedpersonal.runtime import engine_workers
from tests import tolerances
from tests.algorithms import furl_test
from tests.simulation import communication_engine_test as mf_setup

# Imported here, before any test runs, as the engine workers import it in fresh processes: its silos' tf.data
# shuffles combine their seeds with the TF global seed of the moment they are built, which a test run earlier in
# this process may have set (the PFL benchmark binary run here sets it).
from tests.simulation import hpfl_engine_test as silos  # isort: skip

pytest.importorskip('ray')


@pytest.fixture(scope='module', autouse=True)
def _one_ray_runtime():
    """One local Ray runtime for the module's tests, started as `EngineWorkers` starts its own (which then reuses
    it): starting Ray took ~15 s of every test. Each test's workers are still its own actors, stopped with its block."""
    import ray  # pylint: disable=g-import-not-at-top

    # Logical CPUs for two workers and the next test's two while the last test's are being stopped.
    kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False, num_cpus=4)
    engine_workers._init_ray(ray, None, {**kwargs, '_system_config': {'worker_niceness': 0}})
    yield
    ray.shutdown()


_SIZES = (8, 3, 6, 5, 7)  # Three groups of two (the last padded): shares of two groups and one.
_FURL_ROUNDS = ([0, 1, 2], [1, 2, 3], [2, 3, 1])  # Groups of one: shares of two clients and one.


def _max_diff(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b))
    )


# The workers run the local round's group programs on the same groups with the driver's threads and oneDNN setting
# (`EngineWorkers`): only the round's sum over the groups associates by share, ((g0 + g1) + g2 locally against
# worker 0's g0 + g1 plus worker 1's g2, or with balanced shares g0 + (g1 + g2)). The gap is then a reassociation of
# at most 3 groups' sums (and, for the metrics, 5 clients'), carried through the following rounds' training: the MF
# model's depth (a rating: 3 factors and 2 biases; a batch of 4; the mean over 5 clients) and at most 2 batches x
# 2 phases a round, 3 rounds.
_MF = dict(depth=5 + 4 + 5 + 3, steps=3 * 2 * 2)


def _assert_reassociated(a, b, depth, steps):
    """Every leaf of `a` equals `b`'s within the reassociation bound (`tests/tolerances.py`)."""
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        tolerances.assert_reordered_close(
            np.asarray(x, np.float64), np.asarray(y, np.float64), depth=depth, steps=steps
        )


def _fed_recon_setup(dp_seed=None):
    datasets = mf_setup._datasets(_SIZES)
    extra = {}
    if dp_seed is not None:  # Seeded DP (an aggregation process): reproducible noise.
        extra['model_aggregator'] = dp.build_dp_aggregator(
            noise_multiplier=0.5, clients_per_round=len(_SIZES), clip=0.05, noise_seed=dp_seed
        )
        extra['client_weighting'] = tff.learning.ClientWeighting.UNIFORM
    process = mf_setup._build('engine', measure=False, group_size=2, **extra)
    return engine_workers.WorkerSetup(process, lambda cid: datasets[int(cid)])


def _furl_setup():
    process = furl.build_furl(
        furl_test.furl_model_fn, loss_fn=tf.keras.losses.MeanSquaredError, simulation='engine', group_size=1
    )
    return engine_workers.WorkerSetup(process, lambda cid: furl_test.furl_dataset(int(cid)))


def _fed_recon_rounds(setup, after_round=lambda: None):
    ids = [str(i) for i in range(len(_SIZES))]
    state = setup.process.initialize()
    for _ in range(3):
        output = setup.process.run_round(state, process_lib.LazyDatasets(ids, setup.dataset_fn), client_ids=ids)
        state = output.state
        after_round()
    return setup.process.get_model_weights(state), output.metrics


def _furl_rounds(setup):
    process = setup.process
    state = process.initialize()
    private = {u: process.initial_private_state() for u in range(4)}
    for users in _FURL_ROUNDS:
        ids = [str(u) for u in users]
        datasets = process_lib.LazyDatasets(ids, setup.dataset_fn)
        output = process.run_round(state, datasets, [private[u] for u in users], client_ids=ids)
        state = output.state
        private.update(zip(users, output.private_states))
    return process.get_model_weights(state), private, output.metrics


@pytest.mark.numeric
def test_fed_recon_on_two_balanced_engine_workers_equals_the_local_engine():
    """Balanced shares: worker 0 measured 2.5x slower gets one of the three groups (equal shares: two), so the
    shares' sums associate differently from the local round's; the rounds still equal the local engine's to 1e-6."""
    with runtime.LocalRuntime():
        local_weights, local_metrics = _fed_recon_rounds(_fed_recon_setup())
        setup = _fed_recon_setup()
        with engine_workers.EngineWorkers(_fed_recon_setup, workers=2, balance=True) as workers:
            assert engine_workers.active() is workers
            workers.balancer.seconds_per_group[0].append(2.5)
            workers.balancer.seconds_per_group[1].append(1.0)
            rounds = []
            weights, metrics = _fed_recon_rounds(setup, lambda: rounds.append(dict(workers.last_timings)))
            # The first round's split follows the speeds set above (the even split: [2, 1]); later rounds follow
            # speeds measured on this host, which load can make anything, even one worker doing every group.
            timings = rounds[0]
            assert timings['groups'] == [1, 2], rounds
            assert timings['workers'] == 2  # Both workers had a share.
            # The workers' timeline (one host's clock): one merge, after both shares, before the driver got it.
            assert len(timings['merges_s']) == 1 and 0 <= timings['merges_s'][0] <= timings['wait_s']
            assert len(timings['start_delays_s']) == 2 and 0 <= timings['transport_s'] <= timings['wait_s']
            for name in workers.names:  # At this process's priority (Ray's default for its workers is 15).
                pid = int(name.split('pid ')[1].split(' ')[0])
                assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0), name
                # With this process's TensorFlow threads and oneDNN setting, whatever the environment says.
                with open(f'/proc/{pid}/environ', 'rb') as f:
                    env = dict(v.split(b'=', 1) for v in f.read().split(b'\0') if b'=' in v)
                assert env[b'TF_NUM_INTRAOP_THREADS'] == str(engine_workers.driver_threads()).encode(), name
                for key in ('ONEDNN_MAX_CPU_ISA', 'TF_ENABLE_ONEDNN_OPTS'):
                    assert env.get(key.encode()) == (os.environb.get(key.encode())), (name, key)
        assert engine_workers.active() is None
    _assert_reassociated(weights, local_weights, **_MF)
    _assert_reassociated(metrics['client_work'], local_metrics['client_work'], **_MF)
    assert _max_diff(weights, mf_setup._build('engine', measure=False).initialize().global_model_weights) > 1e-3


def test_driver_threads_are_what_tensorflow_resolves(monkeypatch):
    monkeypatch.setenv('TF_NUM_INTRAOP_THREADS', '3')
    assert engine_workers.driver_threads() == 3
    monkeypatch.delenv('TF_NUM_INTRAOP_THREADS')
    assert engine_workers.driver_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(tf.config.threading, 'get_intra_op_parallelism_threads', lambda: 5)
    assert engine_workers.driver_threads() == 5  # tf.config's setting wins over the environment.


def test_seeded_dp_fed_recon_on_engine_workers_equals_the_local_engine():
    """With an aggregation process (seeded DP: each client clipped, noise on the merged sums; each group's result
    sent through the tree, not pre-summed): the same weights and metrics as the local engine."""
    recipe = functools.partial(_fed_recon_setup, dp_seed=3)
    with runtime.LocalRuntime():
        local_weights, local_metrics = _fed_recon_rounds(recipe())
        setup = recipe()
        with engine_workers.EngineWorkers(recipe, workers=2):
            weights, metrics = _fed_recon_rounds(setup)
        noiseless_weights, _ = _fed_recon_rounds(_fed_recon_setup())
    # The clip's norm also sums every global weight's square (30 items x 4).
    clipped = dict(depth=_MF['depth'] + mf_setup.NUM_ITEMS * 4, steps=_MF['steps'])
    _assert_reassociated(weights, local_weights, **clipped)
    _assert_reassociated(metrics['client_work'], local_metrics['client_work'], **clipped)
    assert list(metrics['aggregator']) == list(local_metrics['aggregator']) == ['dp_query_metrics', 'dp']
    assert _max_diff(weights, noiseless_weights) > 1e-4  # The DP aggregation is there.


def test_furl_private_states_on_engine_workers_come_back_to_their_own_clients():
    with runtime.LocalRuntime():
        local_weights, local_private, _ = _furl_rounds(_furl_setup())
        setup = _furl_setup()
        with engine_workers.EngineWorkers(_furl_setup, workers=2):
            weights, private, _ = _furl_rounds(setup)
    _assert_reassociated(weights, local_weights, **_MF)
    for user in range(4):
        _assert_reassociated(private[user], local_private[user], **_MF)
    # The states differ between users, so a mix-up would show.
    assert _max_diff(local_private[0], local_private[3]) > 1e-4


def _fedamp_setup():
    from tests.algorithms import fedamp_test  # pylint: disable=g-import-not-at-top

    arrays = fedamp_test.client_arrays(seed=12)
    process = fedamp_test.build('engine', group_size=2)
    return engine_workers.WorkerSetup(process, lambda cid: fedamp_test.datasets([arrays[int(cid)]])[0])


def _fedamp_rounds(setup):
    process, rounds = setup.process, ([0, 1, 2, 3], [3, 1, 2])  # Groups of two: shares of one group each.
    state, private = process.initialize(), {c: process.initial_private_state() for c in range(4)}
    for clients in rounds:
        ids = [str(c) for c in clients]
        datasets = process_lib.LazyDatasets(ids, setup.dataset_fn)
        output = process.run_round(state, datasets, [private[c] for c in clients], client_ids=ids)
        state = output.state
        private.update(zip(clients, output.private_states))
    return process.get_model_weights(state), private, output.metrics


def test_fedamp_table_on_engine_workers_equals_the_local_engine():
    """A server table (FedAMP's): the workers' rows come back in the clients' order, and the table, models and
    metrics equal the local engine's (the same group programs; only the metrics' sum reassociates)."""
    from tests.algorithms import fedamp_test  # pylint: disable=g-import-not-at-top

    with runtime.LocalRuntime():
        local_table, local_private, local_metrics = _fedamp_rounds(_fedamp_setup())
        setup = _fedamp_setup()
        with engine_workers.EngineWorkers(_fedamp_setup, workers=2) as workers:
            table, private, metrics = _fedamp_rounds(setup)
            assert workers.last_timings['workers'] == 2  # Both workers had a share of the last round.
    np.testing.assert_array_equal(table.non_trainable[0], [1.0, 1.0, 1.0, 0.0])
    assert metrics['table'] == local_metrics['table']
    _assert_reassociated(table, local_table, depth=fedamp_test.DEPTH, steps=fedamp_test.STEPS)
    for client in range(4):
        _assert_reassociated(private[client], local_private[client], depth=fedamp_test.DEPTH, steps=fedamp_test.STEPS)
    _assert_reassociated(metrics['client_work'], local_metrics['client_work'], depth=5 * 10, steps=1)
    assert _max_diff(local_private[0].trainable, local_private[3].trainable) > 1e-3  # A mix-up would show.


def _hpfl_setup(method):

    process = hpfl.build_method(
        method,
        silos.CONFIG,
        client_optimizer=tff.learning.optimizers.build_adam(0.02),
        accuracy_threshold=0.3,
        max_clients=len(silos.IDS),
        kmeans_iterations=3,
        simulation='engine',
    )
    return engine_workers.WorkerSetup(process, dict(zip(silos.IDS, silos.CLIENT_DATA)).__getitem__)


def test_hpfl_silos_on_engine_workers_equal_the_local_engine():
    """The silo engine (HPFL: a server step over every silo's upload, then a second client phase on its result) on
    two workers, the silos shared out differently in the two rounds: the local engine's weights, server state,
    metrics and every silo's private state."""

    recipe = functools.partial(_hpfl_setup, 'hpfl')
    with runtime.LocalRuntime():
        local = silos._rounds(recipe().process, 2)
        setup = recipe()
        with engine_workers.EngineWorkers(recipe, workers=2) as workers:
            state, states, metrics = silos._rounds(setup.process, 2)
            assert workers.last_timings['workers'] == 2 and len(workers.last_timings['shares_s']) == 2
            # Round 1's contiguous shares [[0, 1], [2]]; round 2's by the silos' seconds (the largest two apart).
            second = workers.last_timings['silos']
            assert sorted(i for part in second for i in part) == [0, 1, 2] and second != [[0, 1], [2]], second
    # A silo's phases run whole on one worker; the server step reads the uploads in silo order wherever they ran:
    # equal to the local engine's up to the silo engine's own bound (tests/simulation/hpfl_engine_test.py).
    bound = dict(depth=silos.DEPTH, steps=silos.STEPS)
    _assert_reassociated(state.global_model_weights, local[0].global_model_weights, **bound)
    _assert_reassociated(state.aggregator, local[0].aggregator, **bound)
    _assert_reassociated(metrics, local[2], **bound)
    assert len(states) == len(silos.IDS)
    for got, expected in zip(states, local[1]):
        _assert_reassociated(got, expected, **bound)
    assert _max_diff(local[1][0].model.public, local[1][1].model.public) > 1e-4  # Personalized: a mix-up shows.
    assert (
        _max_diff(
            local[1][0].model.private, silos.hpfl.initial_client_states(silos.DATA, silos.CONFIG)[0].model.private
        )
        > 1e-4
    )


def test_a_killed_engine_worker_stops_the_round_naming_it():
    with runtime.LocalRuntime():
        setup = _fed_recon_setup()
        with engine_workers.EngineWorkers(_fed_recon_setup, workers=2) as workers:
            state = setup.process.initialize()
            ids = [str(i) for i in range(len(_SIZES))]
            setup.process.run_round(state, process_lib.LazyDatasets(ids, setup.dataset_fn), client_ids=ids)
            pid = int(workers.names[1].split('pid ')[1].split(' ')[0])
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(errors.WorkerError, match=f'engine worker 1 \\(pid {pid} on'):
                setup.process.run_round(state, process_lib.LazyDatasets(ids, setup.dataset_fn), client_ids=ids)


def _failing_recipe():
    raise FileNotFoundError('no ratings file at /data/u.data on this machine')


def test_a_recipe_that_fails_on_a_worker_is_named():
    expected = 'engine worker 0.*could not start.*FileNotFoundError.*no ratings file at /data/u.data'
    with pytest.raises(errors.ConfigError, match=expected), engine_workers.EngineWorkers(_failing_recipe, workers=1):
        pass


def test_engine_workers_need_client_ids():
    with runtime.LocalRuntime():
        setup = _fed_recon_setup()
        with engine_workers.EngineWorkers(_fed_recon_setup, workers=1), pytest.raises(ValueError, match='client_ids'):
            setup.process.run_round(setup.process.initialize(), mf_setup._datasets(_SIZES))


def test_what_an_engine_worker_sends_to_the_merge_carries_no_private_only_value():
    """The group program a worker runs (FURL: private user embeddings as input) passes the audit for everything
    that goes to the merge; the control: a program whose metrics sum the private states is caught."""
    setup = _furl_setup()
    runner = setup.process.backend.round_runner
    ids = ['0', '1']
    groups = setup.process.backend.pack(process_lib.LazyDatasets(ids, setup.dataset_fn), client_ids=ids)
    state = setup.process.initialize()
    private = [setup.process.initial_private_state() for _ in groups]
    assert runner.audit_share(state.global_model_weights, groups[0], private[:1]) == []

    @tf.function
    def leaky(weights, private):
        update = [w + 1.0 for w in weights]
        return update, tf.reduce_sum(tf.square(private))  # A metric of the private state alone.

    spec = [tf.TensorSpec([3]), tf.TensorSpec([2])]
    concrete = leaky.get_concrete_function(spec, tf.TensorSpec([4]))
    update, metric = concrete.structured_outputs
    violations = audit.audit_tf_function(concrete, concrete.inputs[2:3], (update, metric))
    assert [v.where for v in violations] == [f'output {metric.name}']
    assert audit.audit_tf_function(concrete, concrete.inputs[2:3], update) == []


def test_what_an_engine_worker_sends_from_a_silo_is_audited():
    """The silo program a worker runs (the silo's private state as input) audited for its upload and metrics, which
    go to the server step: HPFL-K (no centres uploaded) has no output derived from the private state alone; HPFL's
    only such outputs are its centre masks (they depend on the private tables' sizes alone: the known, documented
    declassification that `process.next`'s audit finds too, tests/algorithms/hpfl_test.py)."""
    from fedpersonal.simulation import silo_engine  # pylint: disable=g-import-not-at-top

    private = silos.hpfl.initial_client_states(silos.DATA, silos.CONFIG)[0]
    for method in ('hpfl_k', 'hpfl'):
        process = _hpfl_setup(method).process
        runner, state = process.backend.round_runner, process.initialize()
        client = process.backend.pack([silos.CLIENT_DATA[0]])[0]
        violations = {v.where for v in runner.audit_clients(state, client, private)}
        if method == 'hpfl_k':
            assert violations == set()
            continue
        cut = runner._functions.shrink(client, private, silo_engine.rows)  # pylint: disable=protected-access
        args = [tf.nest.map_structure(tf.convert_to_tensor, a) for a in (runner.distribute(state)[0], *cut)]
        uploads = runner._client_phase.get_concrete_function(*args, None).structured_outputs[0]  # The same trace.
        assert violations == {f'output {uploads.user_mask.name}', f'output {uploads.item_mask.name}'}


@pytest.mark.parametrize(
    'failure',
    [
        RuntimeError('Failed to start GCS.  Last 0 lines of error files:'),
        Exception('The current node timed out during startup. This could happen because some of the Ray processes'),
    ],
)
def test_a_local_ray_start_that_failed_to_start_is_retried(monkeypatch, failure):
    """Two local Ray starts at once can race for the GCS's port or time out waiting for each other's processes:
    retried, not raised; other errors, and a cluster address's, are raised at once."""
    calls = []

    class FakeRay:
        @staticmethod
        def init(address=None, **kwargs):
            calls.append(address)
            if len(calls) == 1 or kwargs.get('bad'):
                raise failure if not kwargs.get('bad') else ValueError('unknown argument bad')

        @staticmethod
        def shutdown():
            calls.append('shutdown')

    monkeypatch.setattr(engine_workers.time, 'sleep', lambda seconds: None)
    engine_workers._init_ray(FakeRay, None, {})  # pylint: disable=protected-access
    assert calls == [None, 'shutdown', None]
    calls.clear()
    with pytest.raises(type(failure), match='GCS|startup'):
        engine_workers._init_ray(FakeRay, 'head:6379', {})  # pylint: disable=protected-access
    assert calls == ['head:6379']
    calls.clear()
    with pytest.raises(ValueError, match='unknown argument'):
        engine_workers._init_ray(FakeRay, None, {'bad': True})  # pylint: disable=protected-access
    assert calls == [None]


def test_shares_cover_every_client_once_in_whole_groups():
    for n in range(1, 40):
        for workers in (1, 2, 3, 5):
            slices = engine_workers.shares([str(i) for i in range(n)], workers, 4)
            assert slices[0][0] == 0 and slices[-1][1] == n and len(slices) <= workers
            assert all(a < b for a, b in slices) and all(s[1] == t[0] for s, t in zip(slices, slices[1:]))
            assert all((b - a) % 4 == 0 for a, b in slices[:-1])


def test_silos_go_longest_first_to_the_least_loaded_worker_and_a_lone_silo_rerun_keeps_the_plan():
    workers = engine_workers.EngineWorkers(lambda: None, workers=2)
    ids = ['a', 'b', 'c', 'd']
    assert workers._silo_shares(ids) == [[0, 1], [2, 3]]  # No seconds measured yet: contiguous shares.
    workers._silo_seconds.update(a=4.0, b=1.0, c=3.0, d=2.0)
    plan = workers._silo_shares(ids)
    assert plan == [[0, 1], [2, 3]]  # a (4) to worker 0, c (3) and d (2) to worker 1, b (1) to worker 0.
    workers._silo_seconds.update(a=100.0, b=0.5)
    assert workers._silo_shares(['c']) == [[0], []]  # A lone silo's rerun (the non-finite check) ...
    assert workers._silo_shares(ids) == plan  # ... keeps the round's plan: its silos stay where they compiled.
    assert workers._silo_shares(ids[:3]) == [[0], [1, 2]]  # Another set of silos: planned from the new seconds.


def test_binary_engine_worker_killed_mid_run_is_named_then_the_rerun_resumes_to_the_local_results(
    tmp_path, monkeypatch, capsys
):
    """The MovieLens binary's FedRecon row with --engine_workers=2 --engine_workers_balance (each worker builds the
    row's data and process from the same configuration): a worker killed in round 3 stops the run naming it (exit status 3); the rerun
    resumes from the round-2 checkpoint and ends with the local run's results."""
    from fedpersonal import faults
    from tests.runtime import distributed_test

    local = str(tmp_path / 'local')
    distributed_test._run_binary(distributed_test.ML_FLAGS + [f'--output_dir={local}'])
    out = str(tmp_path / 'workers')
    argv = distributed_test.ML_FLAGS + [f'--output_dir={out}', '--engine_workers=2', '--engine_workers_balance']
    point, rounds, killed = faults.point, [], []

    def kill_in_round_3(name):
        point(name)
        if name == 'round':
            rounds.append(name)
            assert engine_workers.active().balance  # --engine_workers_balance reached the workers.
            if len(rounds) == 2:  # Before round 3 runs: a worker dies, the round finds it gone.
                name_1 = engine_workers.active().names[1]
                killed.append(name_1)
                os.kill(int(name_1.split('pid ')[1].split(' ')[0]), signal.SIGKILL)

    monkeypatch.setattr(faults, 'point', kill_in_round_3)
    with pytest.raises(SystemExit) as stopped:
        distributed_test._run_binary(argv)
    assert stopped.value.code == 3
    err = capsys.readouterr().err
    assert f'error: {killed[0]} stopped during the round' in err
    assert 'Traceback' not in err
    monkeypatch.undo()
    distributed_test._run_binary(argv)  # Resumes on two new workers.
    resumed, reference = distributed_test._rows(out), distributed_test._rows(local)
    assert set(resumed) == set(reference)
    # The MovieLens binary's FedRecon rows: the MF model's depth, the row's rounds and batches (distributed_test);
    # accuracy counts rounded ratings, which a near tie may flip: only continuous values are compared.
    bound = distributed_test.ML_BOUND
    continuous = lambda key: any(m in key for m in ('rmse', 'loss', 'mae'))
    for name, row in reference.items():
        for key, value in row.items():
            if isinstance(value, float) and continuous(key):
                tolerances.assert_reordered_close(resumed[name][key], value, err_msg=f'{name} {key}', **bound)


def test_engine_workers_balance_without_engine_workers_is_refused(tmp_path):
    from absl import app

    from tests.runtime import distributed_test

    argv = distributed_test.ML_FLAGS + [f'--output_dir={tmp_path}', '--engine_workers_balance']
    with pytest.raises(app.UsageError, match='--engine_workers_balance: it balances engine workers; give --engine_'):
        distributed_test._run_binary(argv)


def test_pfl_benchmark_methods_on_engine_workers_equal_this_process(tmp_path):
    """The PFLlib binary's task with --engine_workers=2 (a stateful method and a step kind's; the stateless path:
    the FedRecon tests above; FedALA's per-client weight learning; shares of two groups and one): the same rows and
    every metric as in this process."""
    import dataclasses  # pylint: disable=g-import-not-at-top

    from fedpersonal.tasks import pfl_benchmark  # pylint: disable=g-import-not-at-top
    from tests.experiments import pfl_benchmark_test  # pylint: disable=g-import-not-at-top

    config = pfl_benchmark.PflBenchmarkConfig(
        **{**pfl_benchmark_test.SMALL, 'synthetic_examples': 600},  # Half the rows: the rounds' time, not the paths.
        configurations=('ditto', 'per_fedavg', 'fedala'),
        per_fedavg_trains_per_round=1,  # Equal either way; one pass keeps the test's time.
        epoch_order='fixed',  # Workers load each client by id, the same data every round.
        total_rounds=2,
        rounds_per_eval=1,
        group_size=2,
    )
    runs = {}
    for where, request in (('here', None), ('workers', engine_workers.Request(2))):
        out = tmp_path / where
        with runtime.LocalRuntime(), engine_workers.requested(request):
            runs[where] = pfl_benchmark.run(dataclasses.replace(config, output_dir=str(out)))
        for name in config.configurations:
            with open(out / name / 'seed0' / 'metrics.csv') as f:
                runs[where][name] = f.read().splitlines()
    # PFLlib's CNN: the convolutions' 5 x 5 and 5 x 5 x 32 terms, the dense layers' 1024, 512 and 10 inputs, the
    # same fan-outs backward, a batch of 10, the mean over 5 clients; steps: a client's (at most 1200 / 5 / 10) batches
    # a round, twice for the methods with two phases, 2 rounds. Accuracy counts predictions: a prediction on a near
    # tie may flip under any reassociation, so only continuous values are compared (the losses).
    bound = dict(depth=2 * (25 + 800 + 1024 + 512 + 10) + 10 + 5, steps=2 * 2 * 24)
    for here, there in zip(runs['here']['rows'], runs['workers']['rows']):
        assert here['method'] == there['method'] and len(here['curve']) == len(there['curve'])
    for name in config.configurations:  # Every round's training losses.
        header = runs['here'][name][0].split(',')
        columns = [i for i, key in enumerate(header) if key.startswith('train/') and 'loss' in key]
        assert len(runs['here'][name]) == 3 and columns, header
        for a, b in zip(runs['here'][name][1:], runs['workers'][name][1:]):
            a, b = a.split(','), b.split(',')
            got, want = [float(a[i]) for i in columns], [float(b[i]) for i in columns]
            tolerances.assert_reordered_close(got, want, err_msg=name, **bound)


def test_hpfl_binary_on_engine_workers_equals_this_process(tmp_path):
    """The HPFL binary's HPFL row with --engine_workers=2 (each worker generates the silos and builds the silo
    engine from the same flags): every round's training and validation metrics (validation reads every silo's
    private state) and the row's test metrics as in this process."""
    from fedpersonal import program  # pylint: disable=g-import-not-at-top
    from tests.experiments import hpfl_user_modeling_test as hpfl_binary  # pylint: disable=g-import-not-at-top

    rows, curves = {}, {}
    for where, extra in (('here', []), ('workers', ['--engine_workers=2'])):
        out = tmp_path / where
        with runtime.LocalRuntime():
            hpfl_binary._run(hpfl_binary.TINY + ['--configurations=hpfl', f'--output_dir={out}', *extra])
        with open(out / 'results.json') as f:
            rows[where] = json.load(f)['rows'][0]
        curves[where] = program.ExperimentOutputs(str(out), 'hpfl').read_metrics()
    # Depth: the GUM's sums over a record's 12 attributes and 4-wide components (4 of them), a batch of 64, the
    # accuracy-weighted mean over 3 silos, a k-means centre's mean over at most 80 item rows; steps: a silo's (at most
    # 8 x 60 / 64) batches, 2 rounds. Rank metrics (AUC, DOA, NDCG) and accuracy order or count predictions, which a
    # near tie may flip: only the continuous metrics are compared.
    bound = dict(depth=12 + 4 * 4 + 64 + 3 + 80, steps=2 * 8)
    continuous = lambda key: any(m in key for m in ('rmse', 'loss', 'mae'))
    assert len(curves['here']) == 2 and 'validation/rmse' in curves['here'][0]
    for here, there in zip(curves['here'], curves['workers']):
        assert set(here) == set(there)
        for key in here:
            if '/' in key and continuous(key):
                tolerances.assert_reordered_close(there[key], here[key], err_msg=key, **bound)
    for key in ('rmse', 'best_validation_rmse'):
        tolerances.assert_reordered_close(rows['workers'][key], rows['here'][key], err_msg=key, **bound)


def test_a_method_engine_workers_cannot_run_is_refused_by_name_before_any_worker_starts(tmp_path, monkeypatch):
    from fedpersonal.tasks import pfl_benchmark  # pylint: disable=g-import-not-at-top
    from tests.experiments import pfl_benchmark_test  # pylint: disable=g-import-not-at-top

    started = []
    monkeypatch.setattr(engine_workers.EngineWorkers, '__enter__', lambda self: started.append(self))
    config = pfl_benchmark.PflBenchmarkConfig(
        **pfl_benchmark_test.SMALL,
        configurations=('fedavg',),
        total_rounds=1,
        output_dir=str(tmp_path),
        simulation='per_client',
        epoch_order='fixed',
    )
    expected = '--engine_workers: FedAvg runs on the per_client backend.*run it without --engine_workers'
    request = engine_workers.Request(2)
    with runtime.LocalRuntime(), engine_workers.requested(request), pytest.raises(errors.ConfigError, match=expected):
        pfl_benchmark.run(config)
    assert not started
