"""A damaged or partial newest checkpoint: a stateless run falls back to the newest intact one and ends with an
uninterrupted run's numbers; a stateful run stops with a usage error naming the checkpoint and the store's round,
and resumes to the same numbers once the checkpoint is restored. Never a traceback from deep inside TensorFlow."""

from __future__ import annotations

import collections
import csv
import functools
import logging
import os
import shutil

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging as absl_logging
from hypothesis import strategies as st

from fedpersonal import core
from fedpersonal import program
from fedpersonal import quiet
from fedpersonal.program import checkpoints as checkpoints_lib
from tests.program import training_loop_test as toy

RUN = 'run'
ROUNDS, LONGER = 4, 6  # Checkpoints at rounds 2 and 4; the rerun goes on to round 6.


def build_stateless_process():
    """Server state s (float32); client input x. Each round s <- s + mean(x + s) / 2 (no private state)."""

    @tff.tensorflow.computation
    def initial_server():
        return tf.constant(0.25)

    @tff.tensorflow.computation(tff.TensorType(np.float32), tff.TensorType(np.float32))
    def client(s, x):
        return x + s

    @tff.tensorflow.computation(tff.TensorType(np.float32))
    def half(v):
        return v / 2.0

    @tff.federated_computation
    def initialize():
        return tff.federated_eval(initial_server, tff.SERVER)

    @tff.federated_computation(initialize.type_signature.result, tff.FederatedType(np.float32, tff.CLIENTS))
    def next_fn(state, xs):
        mean = tff.federated_mean(tff.federated_map(client, (tff.federated_broadcast(state), xs)))
        new_state = tff.federated_map(toy.tf_add, (state, tff.federated_map(half, mean)))
        train = tff.federated_zip(collections.OrderedDict(loss=mean))
        metrics = tff.federated_zip(
            collections.OrderedDict(client_work=tff.federated_zip(collections.OrderedDict(train=train)))
        )
        return core.ProcessOutput(state=new_state, metrics=metrics, private_states=())

    return core.PersonalizedProcess(initialize, next_fn, get_model_weights=lambda s: s)


_STATELESS = build_stateless_process()
_STATEFUL = toy.build_process()


def _run_stateless(root: str, rounds: int):
    state, _ = program.run_learning_process(
        _STATELESS,
        client_data=toy.INPUTS,
        total_rounds=rounds,
        outputs=program.ExperimentOutputs(root, RUN),
        rounds_per_evaluation=2,
        rounds_per_checkpoint=2,
        evaluation_fn=lambda s: {'value': float(s)},
        config={'lr': 1},
        name=RUN,
    )
    return float(state)


def _run_stateful(root: str, rounds: int):
    with toy._store(os.path.join(root, 'states.sqlite')) as store:  # pylint: disable=protected-access
        state, _ = program.run_learning_process(
            _STATEFUL,
            client_data=toy.INPUTS,
            total_rounds=rounds,
            outputs=program.ExperimentOutputs(root, RUN),
            client_state_store=store,
            rounds_per_evaluation=2,
            rounds_per_checkpoint=2,
            client_evaluation_fn=toy._evaluate,  # pylint: disable=protected-access
            config={'lr': 1},
            name=RUN,
        )
        states = store.get(sorted(toy.INPUTS))
    return float(state), [[np.asarray(a).tolist() for a in s] for s in states]


def _rows(root: str) -> list[dict[str, str]]:
    with open(os.path.join(root, RUN, 'metrics.csv')) as f:
        return [{k: v for k, v in row.items() if k != 'round_seconds'} for row in csv.DictReader(f)]


@pytest.fixture(scope='module')
def references(tmp_path_factory):
    """Per method: a directory after ROUNDS rounds (checkpoints 2 and 4), and an uninterrupted LONGER-round run's
    final result and metric rows."""
    made = {}
    for method, run in (('stateless', _run_stateless), ('stateful', _run_stateful)):
        interrupted = str(tmp_path_factory.mktemp(f'{method}_interrupted'))
        run(interrupted, ROUNDS)
        uninterrupted = str(tmp_path_factory.mktemp(f'{method}_uninterrupted'))
        made[method] = (interrupted, run(uninterrupted, LONGER), _rows(uninterrupted))
    return made


def _newest(root: str) -> str:
    return os.path.join(root, RUN, 'checkpoints', f'{checkpoints_lib.PREFIX}{ROUNDS}')


def _checkpoint_files(root: str) -> list[str]:
    newest = _newest(root)
    return sorted(os.path.relpath(os.path.join(d, f), newest) for d, _, files in os.walk(newest) for f in files)


def _truncate(path: str, fraction: float = 0.5) -> None:
    with open(path, 'rb+') as f:
        f.truncate(int(os.path.getsize(path) * fraction))


def _flip(path: str, offset: int | None = None, count: int = 1) -> None:
    with open(path, 'rb+') as f:
        data = bytearray(f.read())
        start = len(data) // 2 if offset is None else offset % max(len(data), 1)
        for i in range(start, min(start + count, len(data))):
            data[i] ^= 0xFF
        f.seek(0)
        f.write(data)


def _copy(reference: str, target: str) -> str:
    shutil.copytree(reference, target)
    return target


def _check_fallback(root: str, expected, expected_rows) -> None:
    assert _run_stateless(root, LONGER) == expected
    assert _rows(root) == expected_rows
    checkpoints = os.listdir(os.path.join(root, RUN, 'checkpoints'))
    assert f'{checkpoints_lib.DAMAGED}{checkpoints_lib.PREFIX}{ROUNDS}' in checkpoints  # Kept aside, not deleted.


def _check_stops(root: str, expected, expected_rows, damaged_file: str, original: str) -> None:
    with pytest.raises(program.DamagedCheckpointError) as raised:
        _run_stateful(root, LONGER)
    message = str(raised.value)
    assert _newest(root) in message and 'round 4' in message and '--fresh_start' in message
    assert os.path.isdir(_newest(root))  # Left in place, to be restored.
    shutil.copyfile(os.path.join(original, damaged_file), os.path.join(_newest(root), damaged_file))
    assert _run_stateful(root, LONGER) == expected  # Restored: resumes to the uninterrupted run's numbers.
    assert _rows(root) == expected_rows


@pytest.mark.parametrize('damage', ['truncated', 'flipped'])
@pytest.mark.parametrize('method', ['stateless', 'stateful'])
def test_every_file_of_a_damaged_checkpoint_falls_back_or_stops_cleanly(references, tmp_path, method, damage):
    reference, expected, expected_rows = references[method]
    files = _checkpoint_files(reference)
    assert checkpoints_lib.MANIFEST in files and any(f.startswith('variables/variables.data') for f in files)
    for i, name in enumerate(files):
        root = _copy(reference, str(tmp_path / f'{i}'))
        path = os.path.join(_newest(root), name)
        (_truncate if damage == 'truncated' else _flip)(path)
        if method == 'stateless':
            _check_fallback(root, expected, expected_rows)
        else:
            _check_stops(root, expected, expected_rows, name, _newest(reference))


def test_a_checkpoint_written_before_manifests_that_does_not_load_is_damage(references, tmp_path):
    reference, expected, expected_rows = references['stateless']
    root = _copy(reference, str(tmp_path / 'legacy'))
    os.remove(os.path.join(_newest(root), checkpoints_lib.MANIFEST))
    data = [f for f in _checkpoint_files(root) if f.startswith('variables/variables.data')][0]
    _truncate(os.path.join(_newest(root), data))
    _check_fallback(root, expected, expected_rows)


def test_every_checkpoint_damaged_starts_a_stateless_run_over(references, tmp_path):
    reference, expected, expected_rows = references['stateless']
    root = _copy(reference, str(tmp_path / 'all'))
    for version in (2, ROUNDS):
        _truncate(os.path.join(root, RUN, 'checkpoints', f'{checkpoints_lib.PREFIX}{version}', 'saved_model.pb'))
    _check_fallback(root, expected, expected_rows)


_DAMAGE = st.sampled_from(['truncate', 'flip', 'delete', 'append', 'empty'])


@hypothesis.settings(max_examples=20, deadline=None, derandomize=True)
@hypothesis.given(
    method=st.sampled_from(['stateless', 'stateful']),
    damages=st.lists(
        st.tuples(st.integers(0, 99), _DAMAGE, st.integers(0, 1 << 30), st.integers(1, 64)), min_size=1, max_size=3
    ),
)
def test_random_damage_to_the_newest_checkpoint_never_gives_a_traceback_or_other_results(
    references, tmp_path_factory, method, damages
):
    """Random damage to random files of the newest checkpoint: the stateless run ends with the uninterrupted run's
    numbers, the stateful one either does too (damage that changes no byte) or stops with DamagedCheckpointError."""
    reference, expected, expected_rows = references[method]
    root = _copy(reference, str(tmp_path_factory.mktemp('random') / 'run'))
    files = _checkpoint_files(root)
    for index, kind, offset, count in damages:
        path = os.path.join(_newest(root), files[index % len(files)])
        if not os.path.exists(path):
            continue
        if kind == 'truncate':
            _truncate(path, (offset % 1000) / 1000)
        elif kind == 'flip':
            _flip(path, offset, count)
        elif kind == 'delete':
            os.remove(path)
        elif kind == 'append':
            with open(path, 'ab') as f:
                f.write(bytes(range(count)))
        else:
            open(path, 'w').close()
    if method == 'stateless':
        assert _run_stateless(root, LONGER) == expected
        assert _rows(root) == expected_rows
        return
    try:
        result = _run_stateful(root, LONGER)
    except program.DamagedCheckpointError as error:
        assert _newest(root) in str(error)
    else:  # Only damage that left every byte as it was (e.g. truncating to the full size) may resume.
        assert checkpoints_lib.damage(_newest(root)) is None
        assert result == expected and _rows(root) == expected_rows


_SAVE_LINES = ('Assets written to', 'Writing fingerprint to', 'Program state saved')


def _save_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(_SAVE_LINES)]


def test_a_checkpoint_save_logs_none_of_its_three_info_lines_unless_asked(tmp_path, caplog, monkeypatch, request):
    """Each save logged 'Assets written to', 'Writing fingerprint to' and 'Program state saved' (issue 62)."""
    monkeypatch.delenv(quiet.VERBOSE_VARIABLE, raising=False)
    request.addfinalizer(functools.partial(absl_logging.set_verbosity, absl_logging.get_verbosity()))
    absl_logging.set_verbosity(absl_logging.INFO)  # A binary's (absl's own is WARNING until its flags are parsed).
    for logger in ('', 'tensorflow'):
        caplog.set_level(logging.INFO, logger=logger)
    checkpoints = checkpoints_lib.Checkpoints(program.ExperimentOutputs(str(tmp_path), RUN))
    checkpoints.save([np.float32(1.5)], 1, None)
    assert not _save_lines(caplog)
    assert checkpoints.load_latest([np.float32(0.0)], None) == ([np.float32(1.5)], 1)  # Saved all the same.

    monkeypatch.setenv(quiet.VERBOSE_VARIABLE, '1')  # The same save with everything logged: the three lines.
    checkpoints.save([np.float32(2.5)], 2, None)
    assert {prefix for line in _save_lines(caplog) for prefix in _SAVE_LINES if line.startswith(prefix)} == set(
        _SAVE_LINES
    )
