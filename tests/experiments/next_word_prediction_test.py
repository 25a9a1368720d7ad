"""Next-word prediction end to end: the binary on the generated default, and FedRecon learning a small language."""

import json
import os

import numpy as np
import pytest
from absl import app
from absl import flags

from experiments import next_word_prediction as binary
from fedpersonal.data import text_corpus
from fedpersonal.tasks import next_word_prediction as nwp_task
from tests import tolerances

FLAGS = flags.FLAGS


def _run(argv):
    FLAGS.unparse_flags()
    FLAGS(['next_word_prediction'] + argv)
    try:
        binary.main([])
    finally:
        FLAGS.unparse_flags()


def test_binary_rows_and_measured_communication(tmp_path, capsys):
    out = str(tmp_path / 'nwp')
    _run(
        [
            '--synthetic_num_clients=20',
            '--vocab_sizes=60',
            '--num_oov_buckets=9',
            '--total_rounds=2',
            '--clients_per_round=2',
            '--embedding_dim=4',
            '--lstm_units=4',
            '--rounds_per_eval=2',
            '--eval_clients=2',
            '--test_clients=3',
            '--max_examples_per_client=16',
            '--configurations=fedrecon,oov_finetuning',
            '--simulation=per_client',  # The engine's communication: test_engine_and_per_client_runs_measure_...
            f'--output_dir={out}',
        ]
    )
    assert 'FedRecon (9 OOV)' in capsys.readouterr().out
    with open(os.path.join(out, 'results.json')) as f:
        results = json.load(f)
    rows = {r['configuration']: r for r in results['tables'][0]['rows']}
    for row in rows.values():
        assert 0.0 <= row['accuracy_no_oov_no_eos'] <= 1.0 and row['num_examples'] > 0
    # FedRecon never sends the 9 x 4 OOV table; the fully global model sends it down and up.
    assert rows['oov_finetuning']['scalars_down_per_client'] - rows['fedrecon']['scalars_down_per_client'] == 36
    assert rows['oov_finetuning']['scalars_up_per_client'] - rows['fedrecon']['scalars_up_per_client'] == 36
    assert os.path.exists(os.path.join(out, 'vocab_60', 'learning_curves.png'))


def test_stackoverflow_needs_a_data_dir(tmp_path):
    with pytest.raises(app.UsageError, match='needs --data_dir'):
        _run(['--dataset=stackoverflow', f'--output_dir={tmp_path}'])


def _cyclic_corpus(num_clients: int, seed: int) -> dict[str, list[str]]:
    """Sentences walk a cycle of 8 words: the next word is a function of the current one."""
    rng = np.random.default_rng(seed)
    words = [f'w{i}' for i in range(8)]
    return {
        f'c{seed}_{i}': [' '.join(words[(s + k) % 8] for k in range(6)) for s in rng.integers(0, 8, size=24)]
        for i in range(num_clients)
    }


def test_fed_recon_learns_a_deterministic_language(tmp_path):
    corpus = text_corpus.TextCorpus(name='cyclic', train=_cyclic_corpus(8, 0), test=_cyclic_corpus(4, 1), source='test')
    config = nwp_task.NextWordPredictionConfig(
        output_dir=str(tmp_path),
        vocab_sizes=(8,),
        num_oov_buckets=3,
        max_sequence_length=6,
        embedding_dim=8,
        lstm_units=16,
        batch_size=8,
        total_rounds=25,
        clients_per_round=4,
        client_learning_rate=0.5,
        server_optimizer='adam',
        server_learning_rate=0.03,
        validation_fraction=0.2,
        rounds_per_checkpoint=100,
        rounds_per_eval=12,
        early_stopping_patience=1,  # Selection on validation ReconEval, as the Figure 3 sweep trains each setting.
    )
    task = nwp_task.NextWordPredictionTask(config, corpus, vocab_size=8)
    process = task.build_fed_recon(3)
    untrained = task.evaluate(
        task.evaluation(3, oov_local=True),
        process.get_model_weights(process.initialize()),
        3,
        'test',
        None,
    )['metrics']
    row = nwp_task.run_fed_recon(task, config.split, 'fedrecon', str(tmp_path))
    assert untrained['accuracy_no_oov_no_eos'] < 0.3
    assert row['accuracy_no_oov_no_eos'] > 0.8
    assert row['best_round'] in (12, 24) and row['best_round'] <= row['rounds'] <= 25
    assert row['best_validation_accuracy_no_oov_no_eos'] > 0.8


# The cyclic task's model: 6 time steps of a 5-unit LSTM over 4-wide embeddings (each gate 4 + 5 terms, back through
# every step), the 8 + 3 + 2 output classes, a batch of 8, the mean over 3 clients; a round is at most 4 steps a
# client (reconstruction and training), the Yogi rows 2 rounds of them.
CYCLIC_DEPTH = 2 * 6 * (4 + 5) + 13 + 8 + 3
CYCLIC_STEPS = 2 * 4


def _cyclic_task(tmp_path, simulation, **overrides):
    """A tiny task on the cyclic corpus (vocabulary 8, 3 OOV buckets) and its first 3 training clients' datasets
    (two groups on the engine, the last one padded); `overrides` are config fields."""
    corpus = text_corpus.TextCorpus(name='cyclic', train=_cyclic_corpus(6, 0), test=_cyclic_corpus(2, 1), source='test')
    config = nwp_task.NextWordPredictionConfig(
        output_dir=str(tmp_path),
        vocab_sizes=(8,),
        num_oov_buckets=3,
        max_sequence_length=6,
        embedding_dim=4,
        lstm_units=5,
        batch_size=8,
        simulation=simulation,
        group_size=2,
        **overrides,
    )
    task = nwp_task.NextWordPredictionTask(config, corpus, vocab_size=8)
    data = task.client_data(3, 'train')
    ids = list(data.client_ids)[:3]
    return task, ids, [task.dataset_fn(data.create_tf_dataset_for_client(c)) for c in ids]


def test_engine_and_per_client_runs_measure_the_same_communication(tmp_path):
    """`--simulation=engine` (default) measures in its round runner what the per-client path's measured parts do."""
    from fedpersonal.metrics import communication

    measured, losses = {}, {}
    for simulation in ('engine', 'per_client'):
        task, ids, datasets = _cyclic_task(tmp_path, simulation)
        process = task.build_fed_recon(3)
        assert process.simulation == simulation
        metrics = process.run_round(process.initialize(), datasets, client_ids=ids).metrics
        measured[simulation] = communication.communication_from_metrics(metrics)
        losses[simulation] = float(metrics['client_work']['train']['loss'])
    assert measured['engine'] == measured['per_client'] and measured['engine']['clients'] == 3
    tolerances.assert_reordered_close(losses['engine'], losses['per_client'], depth=CYCLIC_DEPTH, steps=CYCLIC_STEPS)


def test_fed_yogi_on_the_engine_equals_tff_build_weighted_fed_avg(tmp_path):
    """The FedYogi row trains on the engine's FedAvg: the same weights (in the Keras model's order, as the rows'
    evaluation reads them) and the same measured communication as TFF's `build_weighted_fed_avg`."""
    from fedpersonal.metrics import communication

    weights, measured = {}, {}
    for simulation in ('engine', 'per_client'):
        task, ids, datasets = _cyclic_task(tmp_path, simulation)
        process = task.build_fed_yogi(3)
        run_round = getattr(process, 'run_round', None)
        state = process.initialize()
        for _ in range(2):
            output = run_round(state, datasets, client_ids=ids) if run_round else process.next(state, datasets)
            state = output.state
        weights[simulation] = process.get_model_weights(state).trainable
        measured[simulation] = communication.communication_from_metrics(output.metrics)
    assert measured['engine'] == measured['per_client'] and measured['engine']['clients'] == 3
    assert len(weights['engine']) == len(weights['per_client'])
    for a, b in zip(weights['engine'], weights['per_client']):
        tolerances.assert_reordered_close(a, b, depth=CYCLIC_DEPTH, steps=CYCLIC_STEPS)


def test_train_support_overlap_updates_on_every_example_and_evaluation_stays_disjoint(tmp_path):
    """`train_support_overlap`: FedRecon's update sees all of a client's examples (not the query half), while the
    evaluation of the same task still reconstructs on the support half and scores the query half only. (The task
    hands the split to `build_fed_recon` whatever the simulation; the engine's split of a client's batches equals
    the per-client path's, overlap included: test_numpy_split_equals_dataset_split_function.)"""
    examples, evaluated = {}, {}
    for overlap in (False, True):
        task, ids, datasets = _cyclic_task(tmp_path / str(overlap), 'per_client', train_support_overlap=overlap)
        total = sum(int(sum(len(b['x']) for b in d)) for d in datasets)
        process = task.build_fed_recon(3)
        state = process.initialize()
        metrics = process.run_round(state, datasets, client_ids=ids).metrics
        examples[overlap] = int(metrics['client_work']['train']['num_examples'])
        weights = process.get_model_weights(state)
        evaluation = task.evaluation(3, oov_local=True)
        evaluated[overlap] = task.evaluate(evaluation, weights, 3, 'test', None)['metrics']['num_examples']
    assert examples == {False: total // 2, True: total}  # 24 sequences per client; its query half is 12.
    assert evaluated[True] == evaluated[False] > 0
