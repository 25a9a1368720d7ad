"""HPFL's tables for one dataset: statistics, accuracy (ACC/AUC/RMSE or ACC/MAE/RMSE), DOA/NDCG, figures and the
private-components analysis.

  python benchmarks/hpfl_tables.py --flagfile=configs/hpfl_synthetic.flags --output_dir=/tmp/hpfl_synthetic
  python benchmarks/hpfl_tables.py --flagfile=configs/hpfl_assist.flags \
      --data_dir=/work/shared/data/assist-a0910 --output_dir=/tmp/hpfl_assist
  python benchmarks/hpfl_tables.py --flagfile=configs/hpfl_movielens.flags \
      --data_dir=/work/data/ml-100k --output_dir=/tmp/hpfl_movielens

Runs `fedpersonal.tasks.hpfl_user_modeling.run` and writes `docs/results/hpfl_<dataset>.json`
(``{"command", "dataset", "rows": [{"name", "accuracy", "auc"|"mae", "rmse", "doa", "ndcg", "seconds_per_round",
...}], "statistics", ...}``), the PNGs next to it, and the ``hpfl_<dataset>`` section of `docs/RESULTS.md`.
"""

import dataclasses
import os
import shutil
import sys

from absl import app
from absl import flags
from absl import logging

from fedpersonal import program
from fedpersonal import runtime
from fedpersonal.program import config_flags
from fedpersonal.tasks import hpfl_user_modeling as task

_DEFAULTS = {'output_dir': 'output/hpfl'}
config_flags.define_flags(task.HpflConfig, overrides=_DEFAULTS)
flags.DEFINE_list('seeds', ['0'], 'Seeds of every row (data split, initialization, client sampling).')
flags.DEFINE_string('results_dir', 'docs/results', 'Where the JSON and PNG copies go.')
flags.DEFINE_string('results_md', 'docs/RESULTS.md', 'Markdown results file (its hpfl_<dataset> section is replaced).')
flags.DEFINE_string('notes', '', 'Extra Markdown put under the tables (e.g. what was scaled down versus the paper).')
FLAGS = flags.FLAGS

_PAPER = {
    'binary': 'Paper (ASSIST, 59 schools): NCD 0.727/0.749/0.430, GUM 0.736/0.774/0.421, FedAvg 0.703/0.724/0.445, '
    'FedAtt 0.715/0.727/0.438, HPFL 0.726/0.742/0.431 (ACC/AUC/RMSE); DOA/NDCG HPFL 0.758/0.856.',
    'rating': 'Paper (MovieLens, 10 regions): NCF 0.385/0.759/0.988, GUM 0.397/0.745/0.946, FedAvg 0.397/0.802/0.993, '
    'FedProx 0.405/0.798/0.989, HPFL 0.407/0.786/0.978 (ACC/MAE/RMSE); DOA/NDCG HPFL 0.699/0.910.',
}


def _comparison(rows, task_name):
    """Does HPFL beat every federated baseline on every metric? (text for the RESULTS section)."""
    by_method = {r['method']: r for r in rows}
    if 'hpfl' not in by_method:
        return ''
    metrics = ['accuracy', 'auc', 'rmse'] if task_name == 'binary' else ['accuracy', 'mae', 'rmse']
    metrics += ['doa', 'ndcg']
    lower_is_better = {'rmse', 'mae'}
    federated = [m for m in ('distributed', 'fedsgd', 'fedavg', 'fednoise', 'fedprox', 'fedatt') if m in by_method]
    lines = []
    for variant in ('hpfl', 'hpfl_inverse'):
        if variant not in by_method:
            continue
        hp = by_method[variant]
        losses = []
        for metric in metrics:
            value = hp.get(metric)
            if value is None:
                continue
            for m in federated:
                other = by_method[m].get(metric)
                if other is None:
                    continue
                worse = value > other if metric in lower_is_better else value < other
                if worse:
                    losses.append(f'{metric} vs {by_method[m]["name"]} ({value:.3f} vs {other:.3f})')
        name = by_method[variant]['name']
        if losses:
            lines.append(
                f'- {name} is NOT >= every federated baseline on every metric; it loses on: ' + '; '.join(losses) + '.'
            )
        else:
            names = ', '.join(by_method[m]['name'] for m in federated)
            lines.append(f'- {name} is >= every federated baseline ({names}) on every metric ({", ".join(metrics)}).')
    return '\n'.join(lines)


def _private_summary(results):
    """One sentence comparing HPFL's and Distributed's probe accuracy and silhouette (what the data shows)."""
    methods = results['private_components']['methods']
    if 'hpfl' not in methods or 'distributed' not in methods:
        return ''
    h, d = methods['hpfl'], methods['distributed']
    verdict = 'less' if h['probe_accuracy'] < d['probe_accuracy'] else 'not less'
    near_chance = abs(h['probe_accuracy'] - h['chance']) < 0.05
    return (
        f'Measured: after HPFL a linear probe finds the client from theta with accuracy {h["probe_accuracy"]:.3f} '
        f'(silhouette {h["silhouette"]:.3f}) versus {d["probe_accuracy"]:.3f} ({d["silhouette"]:.3f}) after '
        f'Distributed training, chance {h["chance"]:.3f}: clients are {verdict} distinguishable after HPFL'
        + (', at chance level (the slides\' "not distinguishable").' if near_chance else '.')
    )


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    command = program.command_line('benchmarks/hpfl_tables.py', sys.argv[1:])
    config = config_flags.config_from_flags(task.HpflConfig, overrides=_DEFAULTS)
    seeds = [int(s) for s in FLAGS.seeds]
    with runtime.LocalRuntime():
        results = program.run_seeds(
            task.run,
            config,
            seeds,
            row_key='method',
            std_keys=('accuracy', 'auc', 'mae', 'rmse', 'doa', 'ndcg', 'doa_theta'),
            per_seed_keys=('best_round', 'rounds', 'wall_seconds'),
        )
        # Written before the runtime shuts its workers down, so the results land even if the shutdown stalls.
        first = dataclasses.replace(
            config, seed=seeds[0], output_dir=program.seed_output_dir(config.output_dir, seeds[0])
        )
        _write_results(first, results, command, seeds)


# The results files keep the names they had before --dataset=assist became --dataset=assistments.
_RESULT_NAMES = {'assistments': 'assist'}


def _write_results(config, results, command, seeds):
    name = f'hpfl_{_RESULT_NAMES.get(config.dataset, config.dataset)}'
    images = {}
    os.makedirs(FLAGS.results_dir, exist_ok=True)
    for source in ('attribute_distribution', 'learning_curves', 'private_components'):
        path = os.path.join(config.output_dir, f'{source}.png')
        if os.path.exists(path):
            images[source] = os.path.join(FLAGS.results_dir, f'{name}_{source}.png')
            shutil.copy(path, images[source])
    program.write_json(
        os.path.join(FLAGS.results_dir, f'{name}.json'),
        {
            'command': command,
            'dataset': results['dataset'],
            'task': results['task'],
            'rows': results['rows'],
            'seeds': seeds,
            'statistics': results['statistics'],
            'private_components': results['private_components'],
            'rounds': results['rounds'],
            'ndcg': {'k': results['ndcg_k'], 'gain': results['ndcg_gain']},
            'config': dataclasses.asdict(config),
        },
    )
    rows, task_name = results['rows'], results['task']
    stats = task.format_statistics_table(results['statistics'], results['dataset'])
    accuracy = task.format_accuracy_table(rows, task_name)
    ranking = task.format_ranking_table(rows)
    md_dir = os.path.dirname(os.path.abspath(FLAGS.results_md))
    rel = lambda p: os.path.relpath(os.path.abspath(p), md_dir)
    lines = [
        f'## HPFL: {results["dataset"]} ({task_name} task)',
        '',
        f'Command: `{command}`',
        '',
        f'{results["rounds"]} federated rounds (all {results["statistics"]["num_clients"]} clients every round), '
        f'{config.client_epochs} local epoch(s), {config.client_optimizer} lr {config.client_learning_rate}, '
        f'batch {config.batch_size}, GUM h={config.hidden_dim}, p={config.accuracy_threshold}; centralized '
        f'models {config.centralized_epochs} epochs. Model selection: the round (epoch) with the lowest '
        f'validation RMSE (loss); all metrics on the test split pooled over silos. NDCG@{results["ndcg_k"]} '
        f'with {results["ndcg_gain"]} gain. Mean +- standard deviation over seeds {seeds} (figures and the private-'
        f'components analysis: the first seed); federated rows early-stopped after '
        f'{config.early_stopping_patience} validation evaluations without a lower RMSE (0: none). DOA over pairs of records of the same item within a silo, with '
        f'per-attribute user scores: GUM rows the model-implied proficiency (mean over h of '
        f"sigmoid((theta * M[k]) skill_W), the silo's own public components), NCD sigmoid(theta), NCF the "
        f'mean predicted score over the items with the attribute; DOA on raw theta is the last row.',
        '',
        '### Statistics',
        '',
        stats,
        '',
        '### Accuracy',
        '',
        accuracy,
        '',
        _PAPER.get(task_name, ''),
        '',
        '### Ranking effectiveness (DOA, NDCG)',
        '',
        ranking,
        '',
    ]
    comparison = _comparison(rows, task_name)
    if comparison:
        lines += ['### Does HPFL beat the federated baselines?', '', comparison, '']
    if results['private_components']:
        lines += [
            '### Private components: are clients distinguishable?',
            '',
            "A logistic-regression probe predicts a user's client from their theta row (5-fold CV accuracy "
            "vs the largest client's share); silhouette of theta with client labels.",
            '',
            task.format_private_table(results['private_components']),
            '',
            _private_summary(results),
            '',
        ]
    if FLAGS.notes:
        lines += [FLAGS.notes, '']
    for source, path in images.items():
        lines += [f'![{source}]({rel(path)})', '']
    lines += [f'Machine-readable: `docs/results/{name}.json`.']
    program.replace_marked_section(FLAGS.results_md, name, '\n'.join(lines))
    print(accuracy)
    print()
    print(ranking)


if __name__ == '__main__':
    app.run(main)
