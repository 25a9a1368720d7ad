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


def test_waiting_logs_elapsed_and_time_left_only_while_a_slow_call_lasts(monkeypatch):
    lines = []
    monkeypatch.setattr(logging, 'info', lambda fmt, *args: lines.append(fmt % args))
    with progress.waiting('fast call', expected_seconds=1.0, delay=5.0):
        pass
    assert not lines
    with progress.waiting('slow call', expected_seconds=10.0, delay=0.02, interval=0.05):
        time.sleep(0.3)
    assert len(lines) >= 3 and all(line.startswith('slow call: ') for line in lines)
    assert 'elapsed, ~10s left' in lines[0]
    stopped = len(lines)
    time.sleep(0.15)
    assert len(lines) == stopped  # The reporter ended with the call.
    lines.clear()
    with progress.waiting('first call', delay=0.02, interval=0.05), progress.waiting('late', 0.01, delay=0.02):
        time.sleep(0.1)
    assert any('first call' in line and 'time left unknown' in line for line in lines)
    assert any('late' in line and 'over the expected 0s' in line for line in lines)


def test_per_client_evaluation_is_reported_with_the_previous_calls_time_per_client(monkeypatch):
    from fedpersonal import evaluation  # pylint: disable=g-import-not-at-top

    waits = []
    real = progress.waiting
    monkeypatch.setattr(
        progress,
        'waiting',
        lambda description, expected: (waits.append((description, expected)), real(description, expected))[1],
    )

    def evaluate(weights, datasets):
        time.sleep(0.02 * len(datasets))
        return {'n': len(datasets)}

    assert evaluation.evaluate_clients(evaluate, None, ['a', 'b'], lambda c: c) == {'n': 2}
    assert evaluation.evaluate_clients(evaluate, None, ['a', 'b', 'c', 'd'], lambda c: c) == {'n': 4}
    assert waits[0] == ('evaluation: 2 clients in one TFF call', None)
    assert waits[1][0] == 'evaluation: 4 clients in one TFF call'
    assert 0.07 <= waits[1][1] <= 0.2  # Twice the clients of the first call, at its ~0.02 s per client.
