"""The shared training loop: every-client rounds, nested private states (int32 scalars included) in a durable store,
resume after a crash, model selection across a resume, the config guard."""

import collections
from typing import Any
from typing import NamedTuple

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import client_state
from fedpersonal import core
from fedpersonal import errors
from fedpersonal import program
from tests import tolerances


class Private(NamedTuple):
    count: Any  # int32 scalar
    values: Any  # OrderedDict(a=float32[2])


def _initial_private(count=0, a=(0.0, 0.0)):
    return Private(np.int32(count), collections.OrderedDict(a=np.asarray(a, np.float32)))


def build_process():
    """Server state s (float32); client input x (float32). Each round: a <- a + x + s, count += 1, s <- s + mean(x) /
    2; validation 'score' of a client is |a - 3| summed (lowest at some middle round)."""

    @tff.tensorflow.computation
    def initial_server():
        return tf.constant(0.0)

    @tff.tensorflow.computation
    def initial_private():
        return _initial_private()

    private_type = initial_private.type_signature.result

    @tff.tensorflow.computation(tff.TensorType(np.float32), tff.TensorType(np.float32), private_type)
    def client(s, x, private):
        return Private(private.count + 1, collections.OrderedDict(a=private.values['a'] + x + s)), x

    @tff.tensorflow.computation(tff.TensorType(np.float32))
    def half(v):
        return v / 2.0

    @tff.federated_computation
    def initialize():
        return tff.federated_eval(initial_server, tff.SERVER)

    @tff.federated_computation(
        initialize.type_signature.result,
        tff.FederatedType(np.float32, tff.CLIENTS),
        tff.FederatedType(private_type, tff.CLIENTS),
    )
    def next_fn(state, xs, private):
        new_private, uploads = tff.federated_map(client, (tff.federated_broadcast(state), xs, private))
        mean = tff.federated_mean(uploads)
        new_state = tff.federated_map(tf_add, (state, tff.federated_map(half, mean)))
        metrics = tff.federated_zip(
            collections.OrderedDict(
                client_work=tff.federated_zip(
                    collections.OrderedDict(train=tff.federated_zip(collections.OrderedDict(mean_x=mean)))
                )
            )
        )
        return core.ProcessOutput(state=new_state, metrics=metrics, private_states=new_private)

    return core.PersonalizedProcess(
        initialize,
        next_fn,
        get_model_weights=lambda s: s,
        private_state_type=private_type,
        initial_private_state_fn=initial_private,
    )


@tff.tensorflow.computation(tff.TensorType(np.float32), tff.TensorType(np.float32))
def tf_add(a, b):
    return a + b


INPUTS = collections.OrderedDict(silo_b=np.float32(0.5), silo_a=np.float32(1.0), silo_c=np.float32(-0.25))
SPEC = client_state.spec_of(program.flatten_private_state(_initial_private()))


def _store(path):
    initial = program.flatten_private_state(_initial_private())
    return client_state.SqliteClientStateStore(str(path), SPEC, lambda cid: [a.copy() for a in initial])


def _evaluate(weights, states):
    del weights
    return {'score': float(sum(np.abs(s.values['a'] - 3.0).sum() for s in states))}


def _run(tmp_path, run, rounds, *, config=None):
    process = build_process()
    outputs = program.ExperimentOutputs(str(tmp_path), run)
    selection = program.ModelSelection('score')
    with _store(tmp_path / f'{run}.sqlite') as store:
        state, history = program.run_learning_process(
            process,
            client_data=INPUTS,
            total_rounds=rounds,
            outputs=outputs,
            client_state_store=store,
            client_evaluation_fn=_evaluate,
            rounds_per_evaluation=1,
            rounds_per_checkpoint=2,
            selection=selection,
            evaluation_name='validation',
            config=config or {'lr': 1},
            name=run,
        )
        latest = [program.unflatten_private_state(s, _initial_private()) for s in store.get(list(INPUTS))]
        best = [
            program.unflatten_private_state(s, _initial_private()) for s in selection.best_states(store, list(INPUTS))
        ]
    return state, history, latest, best, selection, outputs


def _assert_same_states(a, b):
    for x, y in zip(a, b):
        assert x.count == y.count and x.count.dtype == np.int32
        np.testing.assert_array_equal(x.values['a'], y.values['a'])


def test_every_client_rounds_resume_after_a_crash_to_the_same_result(tmp_path):
    state, history, latest, best, selection, outputs = _run(tmp_path, 'straight', 6)
    assert len(history) == 6 and [int(s.count) for s in latest] == [6, 6, 6]
    # Every silo, every round, in the given order: silo_b's a after one round is 0 + 0.5 + 0 (server starts at 0).
    # The inputs' sum (1.25) is exact; the mean's float32 division rounds once.
    assert history[0]['train/mean_x'] == pytest.approx(np.mean(list(INPUTS.values())), rel=tolerances.U32)
    scores = [row['validation/score'] for row in history]
    assert selection.best_round == 1 + int(np.argmin(scores)) and 1 < selection.best_round < 6
    assert [int(s.count) for s in best] == [selection.best_round] * 3

    # Crash after round 3 (checkpoint at round 2; round 3's writes pending), then restart with the same flags.
    _run(tmp_path, 'resumed', 3)
    with _store(tmp_path / 'resumed.sqlite') as store:
        assert store.committed_round() == 3  # The last round is always checkpointed; simulate a crash after it:
    resumed_state, resumed_history, resumed_latest, resumed_best, resumed_selection, resumed_outputs = _run(
        tmp_path, 'resumed', 6
    )
    assert len(resumed_history) == 3 and float(resumed_state) == float(state)
    _assert_same_states(resumed_latest, latest)
    _assert_same_states(resumed_best, best)
    assert (resumed_selection.best_round, resumed_selection.best_value) == (selection.best_round, selection.best_value)
    assert [r['validation/score'] for r in resumed_outputs.read_metrics()] == [
        r['validation/score'] for r in outputs.read_metrics()
    ]


def test_uncommitted_rounds_are_rolled_back_on_resume(tmp_path):
    _, _, latest, _, _, _ = _run(tmp_path, 'straight', 4)
    _run(tmp_path, 'crashed', 2)
    with _store(tmp_path / 'crashed.sqlite') as store:  # A killed round 3: written, never checkpointed.
        store.put(list(INPUTS), [program.flatten_private_state(_initial_private(99, (9, 9)))] * 3, round_num=3)
    _, _, resumed_latest, _, _, _ = _run(tmp_path, 'crashed', 4)
    _assert_same_states(resumed_latest, latest)


def test_resume_under_another_config_is_refused(tmp_path):
    _run(tmp_path, 'run', 2, config={'lr': 1, 'rounds': 4})
    with pytest.raises(program.ConfigMismatchError, match='lr: 1 -> 2'):
        _run(tmp_path, 'run', 4, config={'lr': 2, 'rounds': 4})
    _run(tmp_path, 'other', 2, config={'lr': 2, 'rounds': 4})  # A fresh directory records its own.


def test_participation_arguments_are_checked(tmp_path):
    outputs = program.ExperimentOutputs(str(tmp_path), 'bad')
    with pytest.raises(ValueError, match='clients_per_round applies to a ClientData'):
        program.run_learning_process(
            build_process(), client_data=INPUTS, clients_per_round=2, total_rounds=1, outputs=outputs
        )
    with pytest.raises(ValueError, match='client_evaluation_fn needs'):
        program.run_learning_process(
            build_process(), client_data=INPUTS, total_rounds=1, outputs=outputs, client_evaluation_fn=_evaluate
        )


def test_checkpoints_are_atomic_with_the_client_state_commit(tmp_path):
    """A kill between staging a checkpoint and committing the store, or between the commit and publishing the
    checkpoint, restarts from a server state and client states of the same round."""
    import os  # pylint: disable=g-import-not-at-top
    import shutil  # pylint: disable=g-import-not-at-top

    straight_state, _, straight_latest, straight_best, _, _ = _run(tmp_path, 'straight', 6)

    # Killed after staging round 4's checkpoint, before the store committed it: resume from round 2.
    _run(tmp_path, 'before_commit', 2)
    with _store(tmp_path / 'before_commit.sqlite') as store:
        store.put(list(INPUTS), [program.flatten_private_state(_initial_private(7, (7, 7)))] * 3, round_num=3)
    checkpoints = tmp_path / 'before_commit' / 'checkpoints'
    os.makedirs(checkpoints / '.staging', exist_ok=True)
    shutil.copytree(checkpoints / 'program_state_2', checkpoints / '.staging' / 'ready_4')
    shutil.copytree(checkpoints / 'program_state_2', checkpoints / '.staging' / 'program_state_5')  # Partial.
    state, history, latest, best, _, _ = _run(tmp_path, 'before_commit', 6)
    assert len(history) == 4 and float(state) == float(straight_state)
    _assert_same_states(latest, straight_latest)
    _assert_same_states(best, straight_best)
    assert not os.listdir(checkpoints / '.staging')

    # Killed after the store committed round 4, before the checkpoint was published: resume from round 4.
    _run(tmp_path, 'before_publish', 4)
    checkpoints = tmp_path / 'before_publish' / 'checkpoints'
    os.replace(checkpoints / 'program_state_4', checkpoints / '.staging' / 'ready_4')
    state, history, latest, best, _, _ = _run(tmp_path, 'before_publish', 6)
    assert len(history) == 2 and float(state) == float(straight_state)
    _assert_same_states(latest, straight_latest)
    _assert_same_states(best, straight_best)
    assert sorted(os.listdir(checkpoints)) == ['.staging', 'program_state_4', 'program_state_6']


def _scores(rounds):
    """The validation score of every round, simulated in numpy (the process of `build_process`)."""
    x = np.array(list(INPUTS.values()))
    a, s, scores = np.zeros([len(x), 2]), 0.0, []
    for _ in range(rounds):
        a, s = a + x[:, None] + s, s + x.mean() / 2
        scores.append(np.abs(a - 3.0).sum())
    return np.array(scores), s


def _run_stopping(tmp_path, rounds, patience):
    process = build_process()
    stopping = program.EarlyStopping('score', patience=patience)
    tmp_path.mkdir(exist_ok=True)
    with _store(tmp_path / 'stop.sqlite') as store:
        state, history = program.run_learning_process(
            process,
            client_data=INPUTS,
            total_rounds=rounds,
            outputs=program.ExperimentOutputs(str(tmp_path), 'stop'),
            client_state_store=store,
            client_evaluation_fn=_evaluate,
            rounds_per_evaluation=1,
            rounds_per_checkpoint=3,
            stopping=stopping,
            evaluation_name='validation',
            name='stop',
        )
    return state, history, stopping


def test_early_stopping_keeps_the_best_state_and_stops_after_patience_also_across_a_resume(tmp_path):
    scores, _ = _scores(40)
    best = int(np.argmin(scores)) + 1  # The score falls, then rises: one minimum.
    assert 1 < best < 35 and np.all(np.diff(scores[best - 1 :]) > 0)
    _, expected_state = _scores(best)
    state, history, stopping = _run_stopping(tmp_path / 'straight', 40, patience=3)
    assert len(history) == best + 3  # Three stale evaluations, then stop.
    assert stopping.stopped and stopping.best_round == best
    # The process's float32 against `_scores`' float64: a round adds x_i + s to a and mean(x) / 2 to s (the mean's
    # division, the halving), so after R rounds a value has a chain of 2 R additions, the score 6 more (its sum).
    depth = lambda rounds: 2 * rounds + 2 + 6
    tolerances.assert_reordered_close(stopping.best_value, scores[best - 1], depth=depth(best))
    tolerances.assert_reordered_close(stopping.best_state, expected_state, depth=depth(best))
    tolerances.assert_reordered_close(state, _scores(best + 3)[1], depth=depth(best + 3))

    # Interrupted after the best round and before the stop (the checkpoint of round best + 1 or earlier), then
    # resumed with the full budget: the same stop and best state; a further rerun trains no more rounds.
    _run_stopping(tmp_path / 'resumed', best + 1, patience=3)
    _, resumed_history, resumed = _run_stopping(tmp_path / 'resumed', 40, patience=3)
    assert len(resumed_history) == 2  # Rounds best + 2 and best + 3 after the checkpoint of round best + 1.
    assert (resumed.best_round, resumed.stale) == (best, 3)
    tolerances.assert_reordered_close(resumed.best_state, expected_state, depth=depth(best))
    _, again, again_stopping = _run_stopping(tmp_path / 'resumed', 40, patience=3)
    assert again == [] and again_stopping.best_round == best


IDS = sorted(INPUTS)
SCORE_FREQUENCY = 7.0  # Here a client's state at the best round is not one a best round it took part in kept.


def _run_sampled(tmp_path, run, rounds):
    """2 of the 3 clients per round (seeded), early stopping on a score that is not monotone in the rounds (a
    function of the server state), keeping every client's state of the best round."""
    client_data = tff.simulation.datasets.TestClientData({c: [x] for c, x in INPUTS.items()})
    stopping = program.EarlyStopping('score', keep_client_states=True)
    unflatten = lambda states: [program.unflatten_private_state(s, _initial_private()) for s in states]
    with _store(tmp_path / f'{run}.sqlite') as store:
        program.run_learning_process(
            build_process(),
            client_data=client_data,
            dataset_fn=lambda dataset: next(iter(dataset)).numpy(),
            clients_per_round=2,
            seed=1,
            total_rounds=rounds,
            outputs=program.ExperimentOutputs(str(tmp_path), run),
            client_state_store=store,
            evaluation_fn=lambda weights: {'score': float(np.cos(SCORE_FREQUENCY * weights))},
            rounds_per_evaluation=1,
            rounds_per_checkpoint=3,
            stopping=stopping,
            name=run,
        )
        return stopping, unflatten(store.get(IDS)), unflatten(stopping.best_client_states(store, IDS))


def test_early_stopping_keeps_every_clients_private_state_of_the_best_round(tmp_path):
    stopping, latest, best = _run_sampled(tmp_path, 'straight', 12)
    assert 1 < stopping.best_round < 12
    # The same seeded run stopped at the best round: its store holds every client's state of that round, also
    # of those not sampled in it.
    _, at_best_round, _ = _run_sampled(tmp_path, 'short', stopping.best_round)
    _assert_same_states(best, at_best_round)
    assert sorted(int(s.count) for s in best) != [stopping.best_round] * 3  # Some client sat out some rounds.
    assert [int(s.count) for s in best] != [int(s.count) for s in latest]

    # Killed after the checkpoint of the round after the best one, with a later round's kept states written but not
    # committed: the resumed run rolls them back and keeps the same states.
    _run_sampled(tmp_path, 'resumed', stopping.best_round + 1)
    with _store(tmp_path / 'resumed.sqlite') as store:
        garbage = program.flatten_private_state(_initial_private(99, (9, 9)))
        store.put(stopping.state_ids(IDS), [garbage] * 3, round_num=stopping.best_round + 2)
    resumed, resumed_latest, resumed_best = _run_sampled(tmp_path, 'resumed', 12)
    assert (resumed.best_round, resumed.best_value) == (stopping.best_round, stopping.best_value)
    _assert_same_states(resumed_best, best)
    _assert_same_states(resumed_latest, latest)


def test_early_stopping_checks_its_inputs(tmp_path):
    with pytest.raises(ValueError, match='stopping needs an evaluation'):
        program.run_learning_process(
            build_process(),
            client_data=INPUTS,
            total_rounds=1,
            outputs=program.ExperimentOutputs(str(tmp_path), 'x'),
            stopping=program.EarlyStopping('score', patience=1),
        )
    with pytest.raises(ValueError, match='keep_client_states needs a client state store'):
        program.run_learning_process(
            build_process(),
            client_data=INPUTS,
            total_rounds=1,
            outputs=program.ExperimentOutputs(str(tmp_path), 'y'),
            evaluation_fn=lambda w: {'score': 0.0},
            stopping=program.EarlyStopping('score', keep_client_states=True),
        )
    with pytest.raises(errors.ConfigError, match='mode'):
        program.EarlyStopping('score', mode='lowest')
    with pytest.raises(errors.ConfigError, match="'loss' is not among the evaluation metrics"):
        program.EarlyStopping('loss').value_of({'rmse': 1.0})


def test_runs_and_resumes_under_a_running_event_loop_as_in_a_notebook(tmp_path):
    # A Jupyter kernel runs its cells inside an asyncio event loop, where asyncio.run refuses to start; the loop's
    # checkpoints and metric releases must still work there.
    import asyncio  # pylint: disable=g-import-not-at-top

    state, history, latest, *_ = _run(tmp_path, 'straight', 4)

    async def in_a_kernel():
        _run(tmp_path, 'in_loop', 2)
        return _run(tmp_path, 'in_loop', 4)  # Resumes from the checkpoint written under the loop.

    loop_state, loop_history, loop_latest, *_ = asyncio.run(in_a_kernel())
    assert len(loop_history) == 2 and float(loop_state) == float(state)
    _assert_same_states(loop_latest, latest)


class _RecordingBackend:
    """The per-client backend, recording each round's client ids and inputs and every prefetch."""

    name = 'recording'

    def __init__(self):
        self.rounds, self.prefetched = [], []

    def run_round(self, process, state, client_data, private_states, *, client_ids):
        inputs = [float(x) for x in client_data]
        self.rounds.append((client_ids, inputs))
        return process.run_next(state, inputs, private_states)

    def prefetch(self, client_data, client_ids, check=None):
        del check
        self.prefetched.append(list(client_ids))


@pytest.mark.parametrize('by_round', [False, True])
def test_inputs_of_each_round_are_read_afresh_without_ids_or_prefetch(tmp_path, by_round):
    """``round_dataset_fn(client_id, input, round)`` gives each round's input: the process then gets no client ids
    (so an engine packs every round afresh) and no prefetch; without it, ids and the next round's prefetch."""
    process, backend = build_process(), _RecordingBackend()
    process.backend = backend
    client_data = tff.simulation.datasets.TestClientData({c: [x] for c, x in INPUTS.items()})
    round_fn = (lambda client_id, x, round_num: x + 100.0 * round_num) if by_round else None
    with _store(tmp_path / 'states.sqlite') as store:
        program.run_learning_process(
            process,
            client_data=client_data,
            dataset_fn=lambda dataset: next(iter(dataset)).numpy(),
            round_dataset_fn=round_fn,
            clients_per_round=2,
            seed=1,
            total_rounds=3,
            outputs=program.ExperimentOutputs(str(tmp_path), 'run'),
            client_state_store=store,
            name='run',
        )
    assert len(backend.rounds) == 3
    for round_num, (ids, inputs) in enumerate(backend.rounds, start=1):
        sampled = program.sample_clients(client_data.client_ids, 2, round_num, 1)
        want = [float(INPUTS[c]) + (100.0 * round_num if by_round else 0.0) for c in sampled]
        assert inputs == want
        assert ids == (None if by_round else sampled)
    if by_round:
        assert backend.prefetched == []
    else:  # Each round's clients, then the next round's.
        assert backend.prefetched[:2] == [program.sample_clients(client_data.client_ids, 2, r, 1) for r in (1, 2)]
