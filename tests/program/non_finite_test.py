"""The training loop on a non-finite training loss: stop naming the round and the clients, or zero and count."""

import collections
import os
from typing import Any
from typing import NamedTuple

import numpy as np
import pytest

from fedpersonal import program
from fedpersonal.program import training_loop


class _Output(NamedTuple):
    state: Any
    metrics: Any


class _OverflowingProcess:
    """State s (float32) grows by 1 a round; client i's loss is x_i * s, so a huge x_i overflows at some round."""

    def initialize(self):
        return np.float32(1.0)

    def next(self, state, inputs):
        losses = np.asarray([np.float32(x) * np.float32(state) for x in inputs], np.float32)
        metrics = collections.OrderedDict(
            client_work=collections.OrderedDict(
                train=collections.OrderedDict(loss=np.float32(np.mean(losses, dtype=np.float64)))
            )
        )
        return _Output(np.float32(state + 1.0), metrics)

    def get_model_weights(self, state):
        return state


# float32 max is 3.4e38: 1e38 * s overflows from s = 4 (round 4) on.
INPUTS = collections.OrderedDict(a=1.0, b=1e38, c=2.0, d=1e38)


def _run(tmp_path, mode, rounds=6):
    return program.run_learning_process(
        _OverflowingProcess(),
        client_data=INPUTS,
        total_rounds=rounds,
        outputs=program.ExperimentOutputs(str(tmp_path), 'run'),
        rounds_per_checkpoint=1,
        non_finite_clients=mode,
    )


def test_stop_names_the_round_and_the_clients_before_checkpointing_it(tmp_path):
    with pytest.raises(training_loop.NonFiniteLossError) as raised:
        _run(tmp_path, 'stop')
    assert raised.value.round_num == 4
    assert raised.value.client_ids == ['b', 'd']
    checkpoints = sorted(os.listdir(tmp_path / 'run' / 'checkpoints'))
    assert 'program_state_3' in checkpoints and 'program_state_4' not in checkpoints
    rounds = [int(r['round']) for r in program.ExperimentOutputs(str(tmp_path), 'run').read_metrics()]
    assert rounds == [1, 2, 3]


def test_zero_mode_goes_on_counting_the_clients_and_resumes_a_stopped_run(tmp_path):
    with pytest.raises(training_loop.NonFiniteLossError):
        _run(tmp_path, 'stop')
    state, history = _run(tmp_path, 'zero')  # Resumes from round 3's checkpoint.
    assert len(history) == 3  # Rounds 4, 5 and 6.
    assert [row['train/non_finite_clients'] for row in history] == [2, 2, 2]
    assert float(state) == 7.0


def test_finite_runs_report_zero_non_finite_clients(tmp_path):
    inputs = collections.OrderedDict(a=1.0, c=2.0)
    _, history = program.run_learning_process(
        _OverflowingProcess(),
        client_data=inputs,
        total_rounds=2,
        outputs=program.ExperimentOutputs(str(tmp_path), 'run'),
        non_finite_clients='zero',
    )
    assert [row['train/non_finite_clients'] for row in history] == [0, 0]
    assert history[-1]['train/loss'] == 1.5 * 2  # Small integers' products and mean: exact.


def test_non_finite_losses_finds_nested_loss_keys():
    found = training_loop.non_finite_losses({'loss': 1.0, 'model': {'loss': np.nan, 'accuracy': np.nan}})
    assert list(found) == ['train/model/loss'] and np.isnan(found['train/model/loss'])
    assert not training_loop.non_finite_losses({'loss': np.float32(2.0), 'num_examples': np.inf})


def test_unknown_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match='non_finite_clients'):
        _run(tmp_path, 'ignore')
