"""The value-level privacy audit catches what the static audit misses: a toy process whose server output is
`federated_sum(p + 0 * d)` (or one private row) passes `audit_private_dataflow` but fails `audit_round_values`,
in its round outputs and in what the training loop writes (metrics.csv); a clean variant passes both."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import client_state
from fedpersonal import core
from fedpersonal import program
from fedpersonal.privacy import audit
from fedpersonal.privacy import value_audit

ROWS = 3  # Private table p: row 0 is used with the data, rows 1.. are the canary (never touched by training).
DATA = [np.float32(0.5), np.float32(1.25), np.float32(-2.0)]


def canaries(states):
    return [np.asarray(p)[1:] for p in states]


def private_states(base=value_audit.CANARY_BASE):
    return [
        np.concatenate([[0.25 * (i + 1)], value_audit.canary_pattern([ROWS - 1], client=i, base=base)]).astype(
            np.float32
        )
        for i in range(len(DATA))
    ]


def build_toy(leak):
    """Server state s; client data d (float32); private p (float32[ROWS]). Each round: p[0] += d + s on the
    client, s += mean(d) / 2. Metrics: `leak='none'`: sum(d); `'p_plus_zero_d'`: sum(p + 0 * d) (the whole private
    vector, arithmetically mixed with data so the static audit labels it data-derived); `'row'`: sum(p[1] + 0 * d), a scalar."""
    private_type = tff.TensorType(np.float32, [ROWS])

    @tff.tensorflow.computation
    def initial_server():
        return tf.constant(0.0)

    @tff.tensorflow.computation
    def initial_private():
        return tf.zeros([ROWS])

    @tff.tensorflow.computation(tff.TensorType(np.float32), tff.TensorType(np.float32), private_type)
    def client(s, d, p):
        new_p = tf.tensor_scatter_nd_add(p, [[0]], [d + s])
        if leak == 'p_plus_zero_d':
            released = p + 0.0 * d
        elif leak == 'row':
            released = p[1] + 0.0 * d
        else:
            released = d
        return new_p, d, released

    @tff.tensorflow.computation(tff.TensorType(np.float32), tff.TensorType(np.float32))
    def step(s, mean):
        return s + mean / 2.0

    @tff.federated_computation
    def initialize():
        return tff.federated_eval(initial_server, tff.SERVER)

    @tff.federated_computation(
        initialize.type_signature.result,
        tff.FederatedType(np.float32, tff.CLIENTS),
        tff.FederatedType(private_type, tff.CLIENTS),
    )
    def next_fn(state, data, private):
        new_private, uploads, released = tff.federated_map(client, (tff.federated_broadcast(state), data, private))
        new_state = tff.federated_map(step, (state, tff.federated_mean(uploads)))
        train = tff.federated_zip(collections.OrderedDict(released=tff.federated_sum(released)))
        metrics = tff.federated_zip(
            collections.OrderedDict(client_work=tff.federated_zip(collections.OrderedDict(train=train)))
        )
        return core.ProcessOutput(state=new_state, metrics=metrics, private_states=new_private)

    return core.PersonalizedProcess(
        initialize,
        next_fn,
        get_model_weights=lambda s: s,
        private_state_type=private_type,
        initial_private_state_fn=initial_private,
    )


@pytest.mark.parametrize('leak', ['p_plus_zero_d', 'row'])
def test_the_value_audit_catches_a_leak_the_static_audit_misses(leak):
    process = build_toy(leak)
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []  # Fooled by `+ 0 * d`.
    state = process.initialize()
    report = value_audit.audit_round_values(
        lambda p: process.run_round(state, DATA, p),
        private_states(),
        private_states(base=5003.5),
        canaries=canaries,
    )
    assert report.changed == ['metrics/client_work/train/released']
    whats = {s.what for s in report.sightings}
    assert 'sum over clients' in whats and not report.clean
    assert all(s.where.startswith('metrics/client_work/train/released') for s in report.sightings)


def test_a_clean_process_passes_both_audits():
    process = build_toy('none')
    assert audit.audit_private_dataflow(process.next, private_parameter_index=2) == []
    state = process.initialize()
    report = value_audit.audit_round_values(
        lambda p: process.run_round(state, DATA, p), private_states(), private_states(base=5003.5), canaries=canaries
    )
    assert report.clean, report
    # The perturbation does reach the clients' outputs: the canary is part of what stays on the clients.
    out = process.run_round(state, DATA, private_states())
    np.testing.assert_array_equal(canaries(out.private_states), canaries(private_states()))


def test_canary_functions_and_sightings():
    a, b = value_audit.canary_pattern([2], client=0), value_audit.canary_pattern([2], client=1)
    assert a.dtype == np.float32 and a[1] - a[0] == 0.125 and b[0] - a[0] == 97.0
    outputs = {
        'state/w': np.array([1.0, float(a[1]) + float(b[1])], np.float32),  # A sum over clients.
        'metrics/m': np.float32(np.mean(a)),  # A client's mean.
        'metrics/n': np.int32(3),
        'metrics/label': np.array(b'text'),
    }
    sightings = value_audit.canary_sightings(outputs, [a, b])
    assert {(s.where, s.what) for s in sightings} == {
        ('state/w[1]', 'sum over clients'),
        ('metrics/m[0]', 'client 0 canary mean'),
    }
    assert value_audit.changed_outputs({'x': np.float32(0.0)}, {'x': np.float32(-0.0)}) == ['x']  # Bits, not ==.
    assert value_audit.changed_outputs({'x': np.float32(np.nan)}, {'x': np.float32(np.nan)}) == []
    assert value_audit.changed_outputs({'x': np.float32(1)}, {'x': np.float64(1), 'y': 1}) == ['x', 'y']


def _train_with_loop(tmp_path, process, run, base):
    spec = client_state.spec_of(program.flatten_private_state(np.zeros([ROWS], np.float32)))
    initial = {str(i): p for i, p in enumerate(private_states(base=base))}
    store = client_state.InMemoryClientStateStore(spec, lambda cid: [initial[cid].copy()])
    outputs = program.ExperimentOutputs(str(tmp_path / run), 'run')
    state, _ = program.run_learning_process(
        process,
        client_data=DATA,
        total_rounds=2,
        outputs=outputs,
        client_state_store=store,
        rounds_per_checkpoint=1,
        name=run,
    )
    return state, outputs


@pytest.mark.parametrize('leak', ['none', 'row'])
def test_files_the_training_loop_writes(tmp_path, leak):
    """metrics.csv, checkpoints and TensorBoard files: searched for the canaries and compared across runs."""
    process = build_toy(leak)
    runs = {
        base: _train_with_loop(tmp_path, process, f'base{base}', base) for base in (value_audit.CANARY_BASE, 5003.5)
    }
    sightings = {
        base: value_audit.file_sightings(outputs.directory, canaries(private_states(base=base)))
        for base, (_, outputs) in runs.items()
    }
    rows = {base: outputs.read_metrics() for base, (_, outputs) in runs.items()}
    without_time = [[{k: v for k, v in r.items() if 'seconds' not in k} for r in rs] for rs in rows.values()]
    states = [float(state) for state, _ in runs.values()]
    assert states[0] == states[1]  # The server state never depends on p.
    if leak == 'none':
        assert sightings == {base: [] for base in runs}
        assert without_time[0] == without_time[1]
    else:
        for base, found in sightings.items():
            assert any(s.where.endswith(f'metrics.csv:{2}') and s.what == 'sum over clients' for s in found), base
        assert without_time[0] != without_time[1]


def test_file_sightings_in_a_checkpoint_and_a_csv(tmp_path):
    """A canary saved by TFF's program state manager (binary) or written to a CSV (text) is found; other files not."""
    a, b = value_audit.canary_pattern([2], client=0), value_audit.canary_pattern([2], client=1)
    manager = tff.program.FileProgramStateManager(str(tmp_path / 'checkpoints'))
    program.outputs.run_coroutine(manager.save([np.float32(1.5), a + b], version=1))
    (tmp_path / 'metrics.csv').write_text(f'round,loss\n1,0.25\n2,{float(np.mean(b))!r}\n')
    (tmp_path / 'clean.csv').write_text('round,loss\n1,7919.0\n')
    found = value_audit.file_sightings(str(tmp_path), [a, b])
    files = {s.where.split('@')[0].split(':')[0].replace(str(tmp_path), '') for s in found}
    assert '/metrics.csv' in files and any(f.startswith('/checkpoints/') for f in files)
    assert '/clean.csv' not in files
    assert any(s.what == 'sum over clients' and '/checkpoints/' in s.where for s in found)
    assert any(s.what == 'client 1 canary mean' and s.where.endswith('metrics.csv:3') for s in found)
