"""TFF's multi-worker runtime on loopback workers: same results as the local runtime, clear failures, resume."""

import json
import os
import signal
import socket
import subprocess
import threading
from concurrent import futures

import grpc
import numpy as np
import portpicker
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from absl import flags
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

from experiments import movielens_mf as ml_binary
from fedpersonal import errors
from fedpersonal import faults
from fedpersonal import runtime
from fedpersonal.algorithms import furl
from fedpersonal.runtime import distributed
from fedpersonal.runtime import execution_context
from tests import tolerances
from tests.algorithms import furl_test
from tests.simulation import communication_engine_test as mf_setup

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_START = os.path.join(_ROOT, 'scripts', 'start_workers.sh')


class Workers:
    """`scripts/start_workers.sh N PORT` as the README runs it; stopped (and checked stopped) at the end."""

    def __init__(self, n: int, port: int | None = None):
        self.port = port or portpicker.pick_unused_port()
        self.ports = [self.port + i for i in range(n)]
        for p in self.ports:  # The script takes consecutive ports.
            with socket.socket() as s:
                if s.connect_ex(('127.0.0.1', p)) == 0:
                    pytest.skip(f'port {p} is in use')
        self.proc = subprocess.Popen(
            [_START, str(n), str(self.port)], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        line = self.proc.stdout.readline()  # "workers: localhost:P,..." once every worker listens.
        assert line.startswith('workers: '), line
        self.addresses = line.split(': ', 1)[1].strip().split(',')

    def worker_pid(self, index: int) -> int:
        out = subprocess.run(
            ['pgrep', '-f', f'worker_binary --port={self.ports[index]}$'], capture_output=True, text=True
        )
        return int(out.stdout.split()[0])

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(30)
        for port in self.ports:
            left = subprocess.run(['pgrep', '-f', f'worker_binary --port={port}$'], capture_output=True, text=True)
            assert not left.stdout.strip(), f'a worker on port {port} is left running: {left.stdout}'


@pytest.fixture(scope='module')
def two_workers():
    workers = Workers(2)
    yield workers
    workers.stop()


def _max_diff(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b))
    )


def _fed_recon_rounds():
    process = mf_setup._build('engine', measure=False, group_size=2)
    datasets = mf_setup._datasets((8, 3, 6, 5, 7))  # Three groups (the last padded) over two workers.
    ids = [str(i) for i in range(len(datasets))]
    state = process.initialize()
    for _ in range(3):
        output = process.run_round(state, datasets, client_ids=ids)
        state = output.state
    return process.get_model_weights(state), output.metrics


def _furl_rounds(simulation):
    process = furl.build_furl(
        furl_test.furl_model_fn,
        loss_fn=tf.keras.losses.MeanSquaredError,
        simulation=simulation,
        **({'group_size': 1} if simulation == 'engine' else {}),
    )
    state = process.initialize()
    private = {u: process.initial_private_state() for u in range(4)}
    for users in ([0, 1, 2], [1, 2, 3], [2, 3, 1]):  # Three clients over two workers: shares of 2 and 1.
        datasets = [furl_test.furl_dataset(u) for u in users]
        output = process.run_round(state, datasets, [private[u] for u in users], client_ids=[str(u) for u in users])
        state = output.state
        private.update(zip(users, output.private_states))
    return process.get_model_weights(state), private, output.metrics


def test_started_workers_return_large_buffers_to_the_kernel(two_workers):
    """start_workers.sh gives its workers the local runtime's allocator setting (execution_context)."""
    with open(f'/proc/{two_workers.worker_pid(0)}/environ', 'rb') as f:
        environment = f.read().split(b'\0')
    for name, value in execution_context.WORKER_ENVIRONMENT.items():
        assert f'{name}={value}'.encode() in environment


def test_fed_recon_on_two_workers_equals_the_local_runtime(two_workers):
    with runtime.LocalRuntime():
        local_weights, local_metrics = _fed_recon_rounds()
    with runtime.DistributedRuntime(two_workers.addresses):
        assert distributed.active()
        weights, metrics = _fed_recon_rounds()
    assert not distributed.active()
    assert _max_diff(weights, local_weights) <= 1e-5
    assert _max_diff(metrics['client_work'], local_metrics['client_work']) <= 1e-5


@pytest.mark.parametrize('simulation', ['engine', 'per_client'])
def test_furl_private_states_come_back_to_their_own_clients(two_workers, simulation):
    """TFF's own mergeable context concatenates the shares' CLIENTS-placed results in the order the workers finish:
    the one-client share usually finishes first and the states came back as [c, a, b]. Here they keep their order."""
    with runtime.LocalRuntime():
        local_weights, local_private, _ = _furl_rounds(simulation)
    with runtime.DistributedRuntime(','.join(two_workers.addresses)):
        weights, private, _ = _furl_rounds(simulation)
    assert _max_diff(weights, local_weights) <= 1e-5
    for user in range(4):
        assert _max_diff(private[user], local_private[user]) <= 1e-5, user


def test_unreachable_worker_is_named(two_workers):
    # 5 s, not 1: on a loaded host (CI beside other work) the live worker once took over 1 s to accept.
    free = portpicker.pick_unused_port()
    unreachable = runtime.DistributedRuntime([two_workers.addresses[0], f'localhost:{free}'], connect_timeout_seconds=5)
    with pytest.raises(errors.ConfigError, match=rf'--workers: cannot connect to worker localhost:{free} within 5 s'):
        unreachable.__enter__()
    assert not distributed.active()


def test_a_service_that_is_not_a_tff_worker_is_named():
    """A gRPC server without TFF's executor service (as a worker of another protocol version would answer)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port('localhost:0')
    server.start()
    try:
        not_tff = runtime.DistributedRuntime([f'localhost:{port}'])
        with pytest.raises(
            errors.ConfigError, match=rf'worker localhost:{port} failed a probe computation \(UNIMPLEMENTED'
        ):
            not_tff.__enter__()
    finally:
        server.stop(0)


def test_malformed_addresses_name_the_flag():
    for value in ('localhost', 'localhost:http', ':8000', 'a:1,a:1', 'h:70000'):
        with pytest.raises(errors.ConfigError, match='--workers'):
            distributed.parse_workers(value)
    assert distributed.parse_workers(' a:1, b:2 ,') == ['a:1', 'b:2']
    assert distributed.parse_workers('') == []


# FedRecon on the MovieLens binary: cheap to compile. (FURL's private states under the runtime: the test above.)
ML_FLAGS = [
    '--synthetic_num_users=60',
    '--synthetic_num_items=80',
    '--clients_per_round=6',
    '--group_size=2',
    '--eval_clients=5',
    '--batch_size=5',
    '--configurations=fedrecon',
    '--total_rounds=4',
    '--rounds_per_eval=2',
    '--rounds_per_checkpoint=1',
]
# Two runs of ML_FLAGS on different runtimes agree to reassociation (tests/tolerances.py): depth, a rating's 50
# factors and 2 biases, a batch of 5, the mean over 6 clients, an evaluation's sum over a user's (at most 80)
# ratings; steps, a client's reconstruction (5 epochs of at most 8 batches) and training (at most 50) steps, 4 rounds.
ML_BOUND = dict(depth=50 + 2 + 5 + 6 + 80, steps=4 * (5 * 8 + 50))


def _run_binary(argv):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['movielens_mf'] + argv)
    try:
        ml_binary.main([])
    finally:
        flags.FLAGS.unparse_flags()


def _rows(out):
    with open(os.path.join(out, 'results.json')) as f:
        return {r['name']: r for r in json.load(f)['rows']}


def test_worker_killed_mid_round_stops_with_its_address_then_the_run_resumes(tmp_path, monkeypatch, capsys):
    local = str(tmp_path / 'local')
    _run_binary(ML_FLAGS + [f'--output_dir={local}'])

    workers = Workers(2)
    try:
        victim, armed, calls = workers.addresses[1], threading.Event(), []
        point = faults.point

        def arm_after_round_2(name):  # From round 3 on, the victim dies at its next compute call: mid-round.
            point(name)
            if name == 'round':
                calls.append(name)
                if len(calls) == 2:
                    armed.set()

        compute = remote_executor_grpc_stub.RemoteExecutorGrpcStub.compute

        def kill_then_compute(self, request):
            if armed.is_set() and self.address == victim:
                armed.clear()
                os.kill(workers.worker_pid(1), signal.SIGKILL)
            return compute(self, request)

        monkeypatch.setattr(faults, 'point', arm_after_round_2)
        monkeypatch.setattr(remote_executor_grpc_stub.RemoteExecutorGrpcStub, 'compute', kill_then_compute)
        out = str(tmp_path / 'distributed')
        argv = ML_FLAGS + [f'--output_dir={out}', f'--workers={",".join(workers.addresses)}']
        with pytest.raises(SystemExit) as stopped:
            _run_binary(argv)
        assert stopped.value.code == 3
        assert f'error: TFF worker {victim} failed during a computation' in capsys.readouterr().err
        assert not os.path.exists(os.path.join(out, 'results.json'))
        monkeypatch.undo()
        workers.stop()
        workers = Workers(2, port=workers.port)  # The same addresses, restarted.
        _run_binary(argv)  # Resumes from the round-2 checkpoint.
    finally:
        workers.stop()
    resumed, reference = _rows(out), _rows(local)
    assert set(resumed) == set(reference)
    for name, row in reference.items():  # Accuracy counts rounded ratings (a near tie may flip): not compared.
        for key, value in row.items():
            if isinstance(value, float) and any(m in key for m in ('rmse', 'loss', 'mae')):
                tolerances.assert_reordered_close(resumed[name][key], value, err_msg=f'{name} {key}', **ML_BOUND)
    with open(os.path.join(out, 'fedrecon', 'metrics.csv')) as f:
        assert [line.split(',')[0] for line in f.read().splitlines()[1:]] == ['1', '2', '3', '4']  # Once each.


def test_what_leaves_a_worker_carries_no_private_only_value():
    """The part of FURL's round a worker runs up to the aggregation (its partial aggregate is all that goes back to
    the driver before the merge) passes the privacy audit, as the whole round does; the merge sees no private state."""
    from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler

    from fedpersonal.privacy import audit

    for simulation in ('engine', 'per_client'):
        process = furl.build_furl(
            furl_test.furl_model_fn, loss_fn=tf.keras.losses.MeanSquaredError, simulation=simulation
        )
        form = mergeable_comp_compiler.compile_to_mergeable_comp_form(process.next)
        assert audit.audit_private_dataflow(form.up_to_merge, private_parameter_index=2) == [], simulation
        private_shapes = audit.tensor_shapes(process.private_state_type)
        assert not private_shapes & audit.tensor_shapes(form.merge.type_signature.parameter) - {()}, simulation
    # The control: a round that also sums the clients' private embeddings leaks, and its worker part shows it.
    state_type, data_type, private_type = process.next.type_signature.parameter

    @tff.tensorflow.computation(private_type.member)
    def norm(private):
        return tf.reduce_sum(tf.square(private.trainable[0]))

    @tff.federated_computation(state_type, data_type, private_type)
    def leaky(state, data, private):
        out = process.next(state, data, private)
        return out.state, tff.federated_sum(tff.federated_map(norm, private)), out.private_states

    leaky_form = mergeable_comp_compiler.compile_to_mergeable_comp_form(leaky)
    assert audit.audit_private_dataflow(leaky_form.up_to_merge, private_parameter_index=2)
