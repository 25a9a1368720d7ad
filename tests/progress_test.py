"""Progress lines with an ETA: the training loop's estimate and tqdm's status written to the log."""

import time

from absl import logging

from fedpersonal import progress


def test_eta_counts_the_evaluations_left_separately():
    # 10 rounds, evaluation every 5: after round 4, 6 rounds and 2 evaluations (rounds 5 and 10) are left.
    assert progress.eta_text([1.0, 3.0], [10.0], 4, 10, 5) == f'{6 * 2.0 + 2 * 10.0:.0f}s'
    # 12 rounds, every 5: after round 10 one evaluation (the last round's) is left.
    assert progress.eta_text([1.0], [10.0], 10, 12, 5) == '12s'
    assert progress.eta_text([1.0], [10.0], 12, 12, 5) == '0s'
    # No evaluation timed yet: a lower bound.
    assert progress.eta_text([2.0], [], 1, 3, 5) == '>=4s'


def test_logged_yields_everything_and_logs_only_slow_phases(monkeypatch):
    lines = []
    monkeypatch.setattr(logging, 'info', lambda fmt, *args: lines.append(fmt % args))
    assert list(progress.logged(range(5), 5, 'fast', delay=5.0)) == [0, 1, 2, 3, 4]
    assert not lines

    def slow():
        for i in range(3):
            time.sleep(0.05)
            yield i

    assert list(progress.logged(slow(), 3, 'slow phase', delay=0.01, interval=0.01)) == [0, 1, 2]
    assert lines and all(line.startswith('slow phase') for line in lines)
    assert any('/3' in line for line in lines)
