"""The training loop's round lines: a readable rate in the log, every round in metrics.csv."""

import csv
import re

import pytest
from absl import logging

from fedpersonal import program
from fedpersonal import progress
from tests.program.training_loop_test import INPUTS
from tests.program.training_loop_test import _evaluate
from tests.program.training_loop_test import _store
from tests.program.training_loop_test import build_process


def _logged_rounds(tmp_path, monkeypatch, total_rounds):
    lines = []
    # absl's own function: during a TFF run here the absl logger's level is WARNING, so a log capture sees nothing.
    monkeypatch.setattr(logging, 'info', lambda fmt, *args: lines.append(fmt % args))
    with _store(tmp_path / 'states.sqlite') as store:
        program.run_learning_process(
            build_process(),
            client_data=INPUTS,
            total_rounds=total_rounds,
            outputs=program.ExperimentOutputs(str(tmp_path), 'run'),
            client_state_store=store,
            client_evaluation_fn=_evaluate,
            rounds_per_evaluation=3,
            rounds_per_checkpoint=1,
            name='run',
        )
    return [int(m.group(1)) for m in (re.match(r'\[run\] round (\d+)/', line) for line in lines) if m]


def _metrics_rounds(tmp_path):
    with open(tmp_path / 'run' / 'metrics.csv') as f:
        return [int(row['round']) for row in csv.DictReader(f)]


def test_fast_rounds_log_the_first_the_evaluated_and_the_last_and_record_every_round(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(progress, 'ROUND_LINE_SECONDS', 1e9)  # No round is slow enough for a line of its own.
        assert _logged_rounds(tmp_path, patch, 7) == [1, 3, 6, 7]
    assert _metrics_rounds(tmp_path) == list(range(1, 8))
    with monkeypatch.context() as patch:
        patch.setattr(progress, 'ROUND_LINE_SECONDS', 1e9)
        # A resumed run logs its first round (8), then evaluations (9) and the last round (11).
        assert _logged_rounds(tmp_path, patch, 11) == [8, 9, 11]
    assert _metrics_rounds(tmp_path) == list(range(1, 12))


def test_rounds_slower_than_the_interval_are_each_logged(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(progress, 'ROUND_LINE_SECONDS', 0.0)
        assert _logged_rounds(tmp_path, patch, 5) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    'seconds_since_last_line, expected',
    [(29.9, [1, 3, 6, 7]), (30.0, [1, 2, 3, 4, 5, 6, 7])],
)
def test_should_log_round(seconds_since_last_line, expected):
    logged = [
        r
        for r in range(1, 8)
        if progress.should_log_round(
            r, 7, first_round=1, evaluated=r % 3 == 0, seconds_since_last_line=seconds_since_last_line
        )
    ]
    assert logged == expected
    assert progress.should_log_round(5, 7, first_round=5, evaluated=False, seconds_since_last_line=0.0)  # Resumed.
