"""Issue 63: the engine's client cache is bounded in bytes, and the next round's clients are packed while the round
computes (`ClientPacker.prefetch`); neither changes a result, and a bad client still fails the round that uses it."""

import collections
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import algorithms
from fedpersonal import backends
from fedpersonal import errors
from fedpersonal import models
from fedpersonal import program
from fedpersonal.core import input_checks
from fedpersonal.core import process as process_lib
from fedpersonal.program import config_parts
from fedpersonal.simulation import options as simulation_options

DIM, CLASSES, BATCH = 4, 10, 4
SPEC = collections.OrderedDict(x=tf.TensorSpec([None, DIM], tf.float32), y=tf.TensorSpec([None], tf.int32))
IDS = [f'c{k}' for k in range(8)]
# Clients change every round, with some sampled again (after an eviction, under a tiny bound).
ROUNDS = (['c0', 'c1', 'c2'], ['c3', 'c1', 'c4'], ['c5', 'c0', 'c6'])


def _arrays(seed, rows, labels=None):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, rows) if labels is None else labels
    return collections.OrderedDict(x=rng.normal(size=[rows, DIM]).astype(np.float32), y=np.asarray(y, np.int32))


CLIENTS = {c: _arrays(k, 5 + 3 * k) for k, c in enumerate(IDS)}
CLIENTS['bad'] = _arrays(99, 6, labels=[0, 1, 2, 3, CLASSES, 4])  # A label outside the model's outputs.


def _fed_avg(**use):
    def model_fn():
        keras_model = tf.keras.Sequential(
            [
                tf.keras.Input([DIM]),
                tf.keras.layers.Dense(CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(1)),
            ]
        )
        return models.from_keras_model(keras_model, input_spec=SPEC, global_variables=keras_model.variables)

    with backends.use('engine', **use):
        return algorithms.build_fed_avg(
            model_fn,
            loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
            group_size=2,  # Rounds of 3 clients run 2 groups.
        )


class _Counting:
    """Builds the clients' datasets, counting how often each is built (a build is a materialization). `kind`:
    ``'slices'`` array pipelines (read by numpy, `simulation.sliced`), ``'mapped'`` the same through a ``map`` (read
    by a tf.data pass), ``'arrays'`` an `ArrayDatasets` (its numpy batches: no pipeline built)."""

    def __init__(self, kind='slices'):
        self.built, self.kind = collections.Counter(), kind

    def __call__(self, client_id):
        self.built[client_id] += 1
        if self.kind == 'arrays':
            return CLIENTS[client_id]
        dataset = tf.data.Dataset.from_tensor_slices(CLIENTS[client_id])
        return (dataset.map(lambda e: e) if self.kind == 'mapped' else dataset).batch(BATCH)

    def datasets(self, ids):
        if self.kind == 'arrays':
            return process_lib.ArrayDatasets(ids, self, BATCH)
        return process_lib.LazyDatasets(ids, self)


def _run(process, *, prefetch=False, ids=True, rounds=ROUNDS, after_round=None, kind='slices'):
    """The rounds' final weights and every round's metrics; with `prefetch`, each round first prefetches the next
    round's clients (`kind`: how the clients' data is given, `_Counting`)."""
    make, state, metrics = _Counting(kind), process.initialize(), []
    for r, sampled in enumerate(rounds):
        if prefetch and r + 1 < len(rounds):
            process.prefetch(make.datasets(rounds[r + 1]), rounds[r + 1])
        output = process.run_round(state, make.datasets(sampled), client_ids=sampled if ids else None)
        state = output.state
        metrics.append(process_lib.as_numpy(output.metrics))
        if after_round is not None:
            after_round(process)
    return process_lib.as_numpy(process.get_model_weights(state)), metrics, make.built


def _assert_identical(a, b):
    weights_a, metrics_a = a[:2]
    weights_b, metrics_b = b[:2]
    tf.nest.map_structure(np.testing.assert_array_equal, weights_a, weights_b)
    tf.nest.map_structure(np.testing.assert_array_equal, metrics_a, metrics_b)


@pytest.fixture(scope='module')
def reference():
    return _run(_fed_avg())


def test_rounds_with_prefetch_are_bit_identical_and_read_each_client_once(reference):
    prefetched = _run(_fed_avg(), prefetch=True)
    _assert_identical(prefetched, reference)
    assert set(prefetched[2]) == {c for r in ROUNDS for c in r}
    assert set(prefetched[2].values()) == {1}  # Under the default bound nothing is evicted: each client read once.


@pytest.mark.parametrize('kind', ['mapped', 'arrays'])
@pytest.mark.parametrize('prefetch', [False, True])
def test_arrays_read_by_numpy_a_tf_data_pass_and_array_datasets_give_the_same_rounds(reference, kind, prefetch):
    """The reference reads its array pipelines by numpy; a pipeline that tf.data must run, and clients given as
    `ArrayDatasets` (no pipeline built), give the same bits."""
    _assert_identical(_run(_fed_avg(), prefetch=prefetch, kind=kind), reference)


def test_array_datasets_on_the_per_client_backend_give_what_their_pipelines_give():
    """TFF's runtime takes `ArrayDatasets` as any sequence of datasets (their pipelines, built when indexed)."""

    def model_fn():
        keras_model = tf.keras.Sequential(
            [
                tf.keras.Input([DIM]),
                tf.keras.layers.Dense(CLASSES, kernel_initializer=tf.keras.initializers.GlorotUniform(1)),
            ]
        )
        return models.from_keras_model(keras_model, input_spec=SPEC, global_variables=keras_model.variables)

    with backends.use('per_client'):
        process = algorithms.build_fed_avg(
            model_fn,
            loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
            simulation=None,
        )
    rounds = ROUNDS[:2]
    arrays = _run(process, kind='arrays', rounds=rounds)
    assert set(arrays[2]) == {c for r in rounds for c in r}  # Its pipelines, built when indexed.
    _assert_identical(arrays, _run(process, kind='slices', rounds=rounds))


def test_a_tiny_cache_stays_within_its_bound_rematerializes_evicted_clients_and_changes_nothing(reference):
    process = _fed_avg(packed_cache_mb=1000 / (1 << 20))  # 1 KB: two or three of these clients (192-576 bytes).
    packer = process.backend.packer
    assert packer.cache_bytes == 1000
    cached = []

    def after_round(p):
        assert 0 < p.backend.packer.cached_bytes <= p.backend.packer.cache_bytes
        cached.append(p.backend.packer.cached_clients)

    distinct = {c for r in ROUNDS for c in r}
    for prefetch in (False, True):
        bounded = _run(process, prefetch=prefetch, after_round=after_round)
        _assert_identical(bounded, reference)
        assert set(bounded[2]) <= distinct and sum(bounded[2].values()) > len(distinct)  # Evicted ones re-read.
    assert all(0 < len(c) < len(distinct) for c in cached)


def test_rounds_without_ids_read_every_client_every_round_and_agree(reference):
    process = _fed_avg()
    without_ids = _run(process, ids=False)
    _assert_identical(without_ids, reference)
    assert without_ids[2] == collections.Counter(c for r in ROUNDS for c in r)  # Nothing cached, nothing prefetched.
    assert process.backend.packer.cached_clients == []


def test_a_prefetched_bad_client_fails_only_the_round_that_uses_it_naming_it():
    process, make = _fed_avg(), _Counting()
    state = process.initialize()
    process.prefetch(make.datasets(['c0', 'bad', 'c1']), ['c0', 'bad', 'c1'])
    state = process.run_round(state, make.datasets(['c0', 'c1']), client_ids=['c0', 'c1']).state  # Not raised here.
    assert make.built['bad'] == 1  # The prefetch read (and checked) it.
    with pytest.raises(input_checks.LabelRangeError) as raised:
        process.run_round(state, make.datasets(['c2', 'bad']), client_ids=['c2', 'bad'])
    assert raised.value.client_id == 'bad' and "'bad'" in str(raised.value)
    with pytest.raises(input_checks.LabelRangeError):  # And again next time (read and checked anew).
        process.run_round(state, make.datasets(['bad']), client_ids=['bad'])


def test_prefetch_is_a_no_op_on_the_per_client_backend():
    def model_fn():
        keras_model = tf.keras.Sequential([tf.keras.Input([DIM]), tf.keras.layers.Dense(CLASSES)])
        return models.from_keras_model(keras_model, input_spec=SPEC, global_variables=keras_model.variables)

    with backends.use('per_client'):
        process = algorithms.build_fed_avg(
            model_fn, loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), simulation=None
        )
    assert process.simulation == 'per_client'
    make = _Counting()
    process.prefetch(make.datasets(['c0', 'bad']), ['c0', 'bad'])
    assert not make.built


def test_the_cache_bound_option_reaches_the_packers_and_is_checked():
    assert simulation_options.default_cache_bytes() > 0
    assert simulation_options.cache_bytes(None) is None and simulation_options.cache_bytes(2) == 2 << 20
    assert _fed_avg().backend.packer.cache_bytes == simulation_options.default_cache_bytes()
    with backends.use('engine', packed_cache_mb=5):
        assert backends.current_cache_bytes() == 5 << 20
        with backends.use('engine'):  # An inner context keeps it, as it keeps the strategy.
            assert backends.current_packed_cache_mb() == 5
    assert backends.current_packed_cache_mb() is None
    with pytest.raises(ValueError, match='packed_cache_mb'), backends.use('engine', packed_cache_mb=-1):
        pass
    with pytest.raises(errors.ConfigError, match='packed_cache_mb'):
        config_parts.SimulationConfig(packed_cache_mb=-1.0)


def test_the_training_loop_prefetches_the_next_rounds_sample_and_its_results_are_unchanged(tmp_path):
    client_data = tff.simulation.datasets.TestClientData({c: CLIENTS[c] for c in IDS})
    common = dict(
        client_data=client_data,
        dataset_fn=lambda dataset: dataset.batch(BATCH),
        clients_per_round=3,
        seed=4,
        total_rounds=3,
        rounds_per_evaluation=1,
    )

    def run(name, process):
        state, history = program.run_learning_process(
            process, outputs=program.ExperimentOutputs(str(tmp_path), name), name=name, **common
        )
        train = [{k: v for k, v in row.items() if k.startswith('train/')} for row in history]
        return process_lib.as_numpy(process.get_model_weights(state)), train

    process = _fed_avg()
    calls = []
    prefetch = process.prefetch

    def spy(datasets, client_ids):
        calls.append(list(client_ids))
        return prefetch(datasets, client_ids)

    with mock.patch.object(process, 'prefetch', side_effect=spy):
        prefetched = run('prefetched', process)
    samples = [program.sample_clients(IDS, 3, r, 4) for r in (1, 2, 3)]
    # Each round prefetches its own clients (read at once in the first round), then the next round's.
    assert calls == [samples[0], samples[1], samples[1], samples[2], samples[2]]
    plain = _fed_avg()
    plain.prefetch = None  # The loop then prefetches nothing.
    without = run('without', plain)
    tf.nest.map_structure(np.testing.assert_array_equal, prefetched[0], without[0])
    assert prefetched[1] == without[1] and len(prefetched[1]) == 3
