"""Issue 62 on the personalization benchmark: clients smaller than a batch and the dropped partial batches.

A client's last partial train batch is dropped (as PFLlib's DataLoader drop_last): the dropped rows are counted,
logged once and recorded in every row of results.json. A client with fewer train rows than a batch would never train
yet be scored: the partition is refused, naming the clients, whatever the number of clients (60 or 100 here, which
used to pass and fail differently).
"""

import dataclasses
import json
import logging

import pytest

from fedpersonal import errors
from fedpersonal.data import pfllib
from fedpersonal.tasks import pfl_benchmark
from fedpersonal.tasks import pfl_benchmark_evaluation

SMALL = dict(dataset='synthetic', synthetic_examples=1200, num_clients=5, state_store='memory', seeds=(0,))


@pytest.mark.parametrize('num_clients', [60, 100])
def test_a_partition_leaving_a_client_less_than_a_batch_is_refused_naming_the_clients(num_clients):
    """60 clients of 3000 generated pooled train rows leave 3 clients under a batch of 10; 100 clients leave 15 (one
    with 3 train rows): the same rule refuses both."""
    config = pfl_benchmark.PflBenchmarkConfig(**{**SMALL, 'synthetic_examples': 4000, 'num_clients': num_clients})
    with pytest.raises(pfllib.TooFewTrainRowsError) as raised:
        pfl_benchmark.load_data(config)
    error = raised.value
    assert isinstance(error, errors.InputError)  # The binary's usage error: one line, exit status 2.
    assert error.client_ids and all(rows < config.batch_size for rows in error.train_rows)
    assert f'{len(error.client_ids)} of {num_clients} clients have fewer train rows than one batch of 10' in str(error)
    assert f'{error.client_ids[0]} ({error.train_rows[0]})' in str(error)
    # A batch every client fills passes; a benchmark built at a larger batch size is refused the same way.
    smallest = dataclasses.replace(config, batch_size=min(error.train_rows))
    data = pfl_benchmark.load_data(smallest)
    pfl_benchmark_evaluation.Benchmark(smallest, data)
    with pytest.raises(pfllib.TooFewTrainRowsError, match=f'of {num_clients} clients have fewer train rows'):
        pfl_benchmark_evaluation.Benchmark(config, data)


def _stub_run_method(benchmark, outputs, name):
    """`run_method` without training: two evaluation rows, read as a real run's are (`summarize`)."""
    del outputs, name
    rows = [
        {'round': r, 'test/accuracy': a, 'test/mean_client_accuracy': a, 'test/worst_client_accuracy': a / 2}
        for r, a in ((2, 0.4), (4, 0.5 + 0.1 * benchmark.config.seed))
    ]
    return pfl_benchmark.summarize(rows, seconds_per_round=1.0)


def test_dropped_partial_batches_are_counted_logged_once_and_recorded_in_every_row(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger='absl')
    monkeypatch.setattr(pfl_benchmark, 'run_method', _stub_run_method)
    config = pfl_benchmark.PflBenchmarkConfig(
        **{**SMALL, 'seeds': (0, 1), 'batch_size': 16}, configurations=('fedavg', 'fedper'), output_dir=str(tmp_path)
    )
    results = pfl_benchmark.run(config)
    # By hand: the rows in each client's train batches, against its train rows.
    benchmark = pfl_benchmark_evaluation.Benchmark(config, pfl_benchmark.load_data(config))
    trained = [sum(len(b['y']) for b in benchmark.train_dataset(benchmark.train[c])) for c in benchmark.client_ids]
    rows = [r.size for r in benchmark.data.partition.train]
    expected = {
        'train_rows': sum(rows),
        'dropped_train_rows': sum(rows) - sum(trained),
        'clients_with_dropped_rows': sum(t < r for t, r in zip(trained, rows)),
    }
    assert expected['dropped_train_rows'] > 0 and expected['clients_with_dropped_rows'] > 1
    lines = [r.getMessage() for r in caplog.records if 'partial batch' in r.getMessage()]
    assert len(lines) == 1, lines  # Once, not per method and seed.
    assert lines[0].startswith(f'{expected["dropped_train_rows"]} of {expected["train_rows"]} train rows')
    assert f'of {expected["clients_with_dropped_rows"]} of 5 clients' in lines[0]
    for row in results['rows']:
        assert {k: row[k] for k in expected} == expected
    with open(tmp_path / 'results.json') as f:
        assert all({k: row[k] for k in expected} == expected for row in json.load(f)['rows'])
    for method in ('fedavg', 'fedper'):
        with open(tmp_path / method / 'seed1' / 'results.json') as f:
            assert {k: v for k, v in json.load(f).items() if k in expected} == expected
