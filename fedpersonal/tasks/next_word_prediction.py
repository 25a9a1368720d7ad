"""Next-word prediction with local OOV embeddings: the FedRecon paper's Table 2 and Figure 3, end to end.

Rows (the paper's Table 2; B = `num_oov_buckets`, default 500):

* `fedyogi`: a fully global model with 1 OOV bucket trained with FedAvg and a
  Yogi server optimizer (TFF's `build_weighted_fed_avg`) on all of each
  client's data;
* `fedrecon_1oov` / `fedrecon`: FedRecon with a local OOV table of 1 / B rows,
  reconstructed from the support set (first half of the client's examples in
  time order) each round; only the global part is broadcast and aggregated;
* `oov_finetuning`: a fully global model with B OOV buckets trained like
  `fedyogi`; at evaluation the OOV table (starting from its trained value) is
  fine-tuned on the support set;
* `full_finetuning`: the same trained model; the OOV table and then all global
  variables are fine-tuned on the support set;
* `fedrecon_finetune`: FedRecon (B buckets); at evaluation the OOV table is
  reconstructed and then the global variables fine-tuned on the support set.

Every row is evaluated on the same held-out clients' query sets (second half
in time order). Communication per client per round is measured from the
values each process broadcasts and aggregates
(`fedpersonal.metrics.communication`; FedRecon on the fast simulation engine, the
default `--simulation=engine`, measures the same values per logical client in its
round runner, `build_fed_recon(measure_communication=True)`). FedYogi rows run TFF's
`build_weighted_fed_avg` per client.

Configuration flows one way: flags -> `NextWordPredictionConfig` -> builders. The corpus and the task (data, models,
evaluations, processes): `fedpersonal.tasks.next_word_prediction_task`; this module runs the rows and the sweeps.

Every random choice derives from `NextWordPredictionConfig.seed`, so two runs with the same config give
bit-identical metrics (on CPU): the generated corpus and the train/test client split, the validation clients
(``seed + 7``), every model's initial weights (`next_word_prediction.model_fn` / `build_keras_model` with ``seed``:
FedRecon's clients reconstruct the OOV table from the same initial value every round), the clients sampled each
round ((``seed``, round)) and the evaluation clients (``seed + 1``). `run` also sets TensorFlow's global seed to
``seed``, so the op-level seeds combine with the same graph-level seed whatever ran earlier in the process.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any
from typing import ClassVar

import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import algorithms
from fedpersonal import program
from fedpersonal.data import text_corpus
from fedpersonal.program import run_record
from fedpersonal.tasks import next_word_prediction_task as task_lib
from fedpersonal.tasks.next_word_prediction_config import CONFIGURATIONS as CONFIGURATIONS
from fedpersonal.tasks.next_word_prediction_config import DATASETS as DATASETS
from fedpersonal.tasks.next_word_prediction_config import NextWordPredictionConfig as NextWordPredictionConfig
from fedpersonal.tasks.next_word_prediction_task import COMMUNICATION_KEYS as COMMUNICATION_KEYS
from fedpersonal.tasks.next_word_prediction_task import METRIC_KEYS as METRIC_KEYS
from fedpersonal.tasks.next_word_prediction_task import NextWordPredictionTask as NextWordPredictionTask
from fedpersonal.tasks.next_word_prediction_task import load_corpus as load_corpus


def row_name(configuration: str, num_oov_buckets: int) -> str:
    return {
        'fedyogi': 'FedYogi (1 OOV)',
        'fedrecon_1oov': 'FedRecon (1 OOV)',
        'fedrecon': f'FedRecon ({num_oov_buckets} OOV)',
        'oov_finetuning': f'OOV Finetuning ({num_oov_buckets} OOV)',
        'full_finetuning': f'Full Finetuning ({num_oov_buckets} OOV)',
        'fedrecon_finetune': f'FedRecon+Finetune ({num_oov_buckets} OOV)',
    }[configuration]


class _Runner:
    """Trains each underlying model once per vocabulary size and derives the Table 2 rows from it."""

    def __init__(self, task: NextWordPredictionTask, output_dir: str):
        self.task = task
        self.output_dir = output_dir
        self._trained: dict[str, tuple] = {}

    def trained(self, kind: str, num_oov_buckets: int):
        """`(weights, training summary)` of `fedyogi` or `fedrecon` with `num_oov_buckets`."""
        key = f'{kind}_{num_oov_buckets}oov'
        if key in self._trained:
            return self._trained[key]
        task, cfg = self.task, self.task.config
        outputs = program.ExperimentOutputs(self.output_dir, key)
        if kind == 'fedrecon':
            process = task.build_fed_recon(num_oov_buckets)
            eval_computation = task.evaluation(num_oov_buckets, oov_local=True)
            eval_fn = lambda w: task.evaluate(eval_computation, w, num_oov_buckets, 'validation', cfg.eval_clients)[
                'metrics'
            ]
        else:
            process = task.build_fed_yogi(num_oov_buckets)
            eval_computation = task.evaluation(num_oov_buckets, oov_local=True, learn_local_init=True)
            eval_fn = lambda w: task.evaluate(
                eval_computation,
                task.partially_local_weights(num_oov_buckets, list(w.trainable)),
                num_oov_buckets,
                'validation',
                cfg.eval_clients,
            )['metrics']
        state, summary = task_lib.train(task, process, key, outputs, num_oov_buckets, eval_fn)
        weights = process.get_model_weights(state)
        outputs.plot_learning_curve(['train/loss', 'eval/accuracy_no_oov_no_eos'], title=key)
        self._trained[key] = (weights, summary)
        return self._trained[key]

    def _fedyogi(self, configuration: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """FedYogi with one OOV bucket, tested as is."""
        task, cfg = self.task, self.task.config
        weights, summary = self.trained('fedyogi', 1)
        # No local variables: "reconstruction" is a no-op, the trained OOV row is used as is.
        computation = task.evaluation(
            1, oov_local=True, learn_local_init=True, split=dataclasses.replace(cfg.split, recon_steps_max=0)
        )
        final = task.evaluate(
            computation, task.partially_local_weights(1, list(weights.trainable)), 1, 'test', cfg.test_clients
        )
        return final, summary

    def _fedrecon(self, configuration: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """FedRecon (one OOV bucket for 'fedrecon_1oov'; fine-tuned after reconstruction for 'fedrecon_finetune')."""
        task, cfg = self.task, self.task.config
        buckets = 1 if configuration == 'fedrecon_1oov' else cfg.num_oov_buckets
        weights, summary = self.trained('fedrecon', buckets)
        computation = task.evaluation(buckets, oov_local=True, finetune=configuration == 'fedrecon_finetune')
        return task.evaluate(computation, weights, buckets, 'test', cfg.test_clients), summary

    def _finetuning(self, configuration: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """FedYogi's model with local OOV rows learned per client ('full_finetuning': every variable fine-tuned)."""
        task, cfg = self.task, self.task.config
        b = cfg.num_oov_buckets
        weights, summary = self.trained('fedyogi', b)
        computation = task.evaluation(
            b, oov_local=True, learn_local_init=True, finetune=configuration == 'full_finetuning'
        )
        final = task.evaluate(
            computation, task.partially_local_weights(b, list(weights.trainable)), b, 'test', cfg.test_clients
        )
        return final, summary

    # A row's runner: `(runner, configuration) -> (final test evaluation, training summary)`.
    RUNNERS: ClassVar[dict[str, Callable[[Any, str], tuple[dict[str, Any], dict[str, Any]]]]] = {
        'fedyogi': _fedyogi,
        'fedrecon': _fedrecon,
        'fedrecon_1oov': _fedrecon,
        'fedrecon_finetune': _fedrecon,
        'oov_finetuning': _finetuning,
        'full_finetuning': _finetuning,
    }

    def row(self, configuration: str) -> dict[str, Any]:
        """Trains (once per model) and tests one Table 2 configuration; returns its result row."""
        b = self.task.config.num_oov_buckets
        started = time.time()
        final, summary = program.runner_for(self.RUNNERS, configuration)(self, configuration)
        row: dict[str, Any] = {'name': row_name(configuration, b), 'configuration': configuration}
        row.update({k: final['metrics'][k] for k in METRIC_KEYS if k in final['metrics']})
        row.update(summary)
        row['per_client'] = final['per_client']
        row['eval_seconds'] = time.time() - started
        return row


def run(config: NextWordPredictionConfig, corpus: text_corpus.TextCorpus | None = None) -> dict[str, Any]:
    """Runs every configuration for every vocabulary size; writes `results.json` and learning curves."""
    run_record.check_output_dir(config)  # Also when called directly; a binary has checked (same config).
    tf.random.set_seed(config.seed)
    corpus = corpus if corpus is not None else load_corpus(config)
    statistics = text_corpus.corpus_statistics(corpus, vocab_sizes=config.vocab_sizes)
    logging.info('NWP data %s: %s', corpus.name, statistics)
    program.write_json(f'{config.output_dir}/config.json', dataclasses.asdict(config))
    tables = []
    for vocab_size in config.vocab_sizes:
        task = NextWordPredictionTask(config, corpus, vocab_size)
        directory = f'{config.output_dir}/vocab_{vocab_size}'
        runner = _Runner(task, directory)
        rows = []
        for configuration in config.configurations:
            row = runner.row(configuration)
            row['vocab_size'] = vocab_size
            logging.info(
                '[vocab %d] %s: %s', vocab_size, row['name'], {k: row.get(k) for k in METRIC_KEYS + COMMUNICATION_KEYS}
            )
            rows.append(row)
        task.client_data(config.num_oov_buckets, 'train')
        tables.append(
            {
                'vocab_size': vocab_size,
                'vocabulary_coverage': task.coverage,
                'token_statistics': getattr(task, 'token_statistics', {}),
                'rows': rows,
            }
        )
        runs = {name: program.ExperimentOutputs(directory, name).read_metrics() for name in sorted(runner._trained)}
        program.plot_curves(
            runs,
            ['train/loss', 'eval/accuracy_no_oov_no_eos'],
            f'{directory}/learning_curves.png',
            title=f'{corpus.name}, vocabulary {vocab_size}: metrics per round',
        )
    results = {'dataset': corpus.name, 'source': corpus.source, 'statistics': statistics, 'tables': tables}
    program.write_json(f'{config.output_dir}/results.json', results)
    return results


def format_table(tables: list[dict[str, Any]], metric: str = 'accuracy_no_oov_no_eos') -> str:
    """The paper's Table 2 shape: rows x vocabulary sizes of `metric` (percent), plus measured communication."""
    sizes = [t['vocab_size'] for t in tables]
    names = [r['name'] for r in tables[0]['rows']]
    header = '| method | ' + ' | '.join(f'{s} vocab' for s in sizes) + ' | scalars down/up per client per round |'
    lines = [header, '|---' * (len(sizes) + 2) + '|']
    for i, name in enumerate(names):
        cells = []
        for t in tables:
            value, std = t['rows'][i].get(metric), t['rows'][i].get(f'{metric}_std')
            many = len(t['rows'][i].get('seeds', [])) > 1
            cells.append('' if value is None else f'{100 * value:.1f}' + (f' +- {100 * std:.1f}' if many else ''))
        last = tables[-1]['rows'][i]
        comm = (
            f'{last.get("scalars_down_per_client", float("nan")):,.0f} / '
            f'{last.get("scalars_up_per_client", float("nan")):,.0f}'
        )
        lines.append(f'| {name} | ' + ' | '.join(cells) + f' | {comm} (vocab {sizes[-1]}) |')
    return '\n'.join(lines)


def train_fed_recon(
    task: NextWordPredictionTask,
    split: algorithms.ReconstructionSplit,
    name: str,
    output_dir: str,
    num_oov_buckets: int | None = None,
) -> tuple[tff.learning.models.ModelWeights, dict[str, Any]]:
    """Trains FedRecon with `split` (k_r / k_u settings); returns the global weights and a training summary.

    Used by the reconstruction/update-steps sweeps (the paper's Figure 3). Resumes from `output_dir/name`'s
    checkpoints. With ``early_stopping_patience``, early-stopped on validation accuracy (ReconEval with `split` on
    ``eval_clients`` validation clients every ``rounds_per_eval`` rounds) and returning the best round's weights;
    otherwise the last round's.
    """
    cfg = task.config
    buckets = num_oov_buckets or cfg.num_oov_buckets
    outputs = program.ExperimentOutputs(output_dir, name)
    process = task.build_fed_recon(buckets, split)
    eval_fn = None
    if cfg.early_stopping_patience:
        computation = task.evaluation(buckets, oov_local=True, split=split)
        eval_fn = lambda w: task.evaluate(computation, w, buckets, 'validation', cfg.eval_clients)['metrics']
    state, summary = task_lib.train(task, process, name, outputs, buckets, eval_fn=eval_fn)
    return process.get_model_weights(state), summary


def evaluate_fed_recon(
    task: NextWordPredictionTask,
    weights: tff.learning.models.ModelWeights,
    split: algorithms.ReconstructionSplit,
    num_oov_buckets: int | None = None,
) -> dict[str, float]:
    """ReconEval of FedRecon `weights` on the test clients, reconstructing with `split`."""
    buckets = num_oov_buckets or task.config.num_oov_buckets
    final = task.evaluate(
        task.evaluation(buckets, oov_local=True, split=split), weights, buckets, 'test', task.config.test_clients
    )
    return {k: final['metrics'][k] for k in METRIC_KEYS if k in final['metrics']}


def run_fed_recon(
    task: NextWordPredictionTask,
    split: algorithms.ReconstructionSplit,
    name: str,
    output_dir: str,
    num_oov_buckets: int | None = None,
) -> dict[str, Any]:
    """Trains FedRecon with `split` and evaluates it on the test clients with the same split."""
    weights, summary = train_fed_recon(task, split, name, output_dir, num_oov_buckets)
    row = {'name': name, **evaluate_fed_recon(task, weights, split, num_oov_buckets), **summary}
    program.write_json(f'{output_dir}/{name}/results.json', row)
    return row
