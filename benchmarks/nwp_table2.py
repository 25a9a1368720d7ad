"""The FedRecon paper's Table 2 (next-word prediction with local OOV embeddings) and its communication comparison.

  python benchmarks/nwp_table2.py --flagfile=configs/nwp_synthetic.flags --output_dir=output/nwp_synthetic
  python benchmarks/nwp_table2.py --flagfile=configs/nwp_shakespeare.flags \
      --data_dir=../shared/data/shakespeare --output_dir=output/nwp_shakespeare

Runs `fedpersonal.tasks.next_word_prediction.run` and writes
`docs/results/nwp_<dataset>.json` (one row per method and vocabulary size with
`accuracy`, `accuracy_no_oov`, `accuracy_no_oov_no_eos`, the measured
`scalars_down_per_client` / `scalars_up_per_client` / `bytes_down_per_client` /
`bytes_up_per_client` and `seconds_per_round`), the learning curves, and the
`nwp_<dataset>` section of `docs/RESULTS.md`.
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
from fedpersonal.tasks import next_word_prediction as nwp_task

_DEFAULTS = {'output_dir': 'output/nwp'}
config_flags.define_flags(nwp_task.NextWordPredictionConfig, overrides=_DEFAULTS)
flags.DEFINE_string('results_dir', 'docs/results', 'Where the JSON and PNG copies go.')
flags.DEFINE_string('results_md', 'docs/RESULTS.md', 'Markdown results file (its nwp_<dataset> section is replaced).')
flags.DEFINE_list('seeds', ['0'], 'Seeds of every row (initialization, client sampling, reconstruction).')
flags.DEFINE_string(
    'results_name', None, 'Name of the JSON file, the PNG copies and the RESULTS section (default: nwp_<dataset>).'
)
flags.DEFINE_string('notes', '', 'Extra Markdown put under the section header (e.g. what the run shows).')
FLAGS = flags.FLAGS

_TRAINING = {
    'fedyogi': 'FedYogi, 1 OOV bucket, all variables global',
    'fedrecon_1oov': 'FedRecon, 1 local OOV row',
    'fedrecon': 'FedRecon, B local OOV rows',
    'oov_finetuning': 'FedYogi, B OOV buckets, all variables global',
    'full_finetuning': 'FedYogi, B OOV buckets, all variables global',
    'fedrecon_finetune': 'FedRecon, B local OOV rows',
}


def communication_table(tables) -> str:
    lines = [
        '| method | vocab | trained as | scalars down | scalars up | bytes down | bytes up |',
        '|---|---|---|---|---|---|---|',
    ]
    for table in tables:
        for r in table['rows']:
            lines.append(
                f'| {r["name"]} | {table["vocab_size"]} | {_TRAINING[r["configuration"]]} | '
                f'{r.get("scalars_down_per_client", float("nan")):,.0f} | '
                f'{r.get("scalars_up_per_client", float("nan")):,.0f} | '
                f'{r.get("bytes_down_per_client", float("nan")):,.0f} | '
                f'{r.get("bytes_up_per_client", float("nan")):,.0f} |'
            )
    return '\n'.join(lines)


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    command = program.command_line('benchmarks/nwp_table2.py', sys.argv[1:])
    config = config_flags.config_from_flags(nwp_task.NextWordPredictionConfig, overrides=_DEFAULTS)
    seeds = [int(s) for s in FLAGS.seeds]
    with runtime.LocalRuntime():
        results = program.run_seeds(
            nwp_task.run,
            config,
            seeds,
            row_key=('configuration', 'vocab_size'),
            std_keys=nwp_task.METRIC_KEYS,
            per_seed_keys=('best_round', 'rounds'),
            rows_of=lambda r: [row for table in r['tables'] for row in table['rows']],
        )
    for table in results['tables']:  # The tables' rows, averaged over the seeds.
        table['rows'] = [r for r in results['rows'] if r['vocab_size'] == table['vocab_size']]
    config = dataclasses.replace(config, seed=seeds[0], output_dir=program.seed_output_dir(config.output_dir, seeds[0]))
    name = FLAGS.results_name or f'nwp_{config.dataset}'
    os.makedirs(FLAGS.results_dir, exist_ok=True)
    rows = []
    for table in results['tables']:
        for r in table['rows']:
            rows.append(
                {k: v for k, v in r.items() if k != 'per_client'}
                | {'vocabulary_coverage': table['vocabulary_coverage']}
            )
    program.write_json(
        os.path.join(FLAGS.results_dir, f'{name}.json'),
        {
            'command': command,
            'dataset': results['dataset'],
            'source': results['source'],
            'statistics': results['statistics'],
            'config': dataclasses.asdict(config),
            'rows': rows,
            'token_statistics': {t['vocab_size']: t['token_statistics'] for t in results['tables']},
        },
    )
    md_dir = os.path.dirname(os.path.abspath(FLAGS.results_md))
    images = []
    for table in results['tables']:
        source = os.path.join(config.output_dir, f'vocab_{table["vocab_size"]}', 'learning_curves.png')
        if os.path.exists(source):
            target = os.path.join(FLAGS.results_dir, f'{name}_vocab{table["vocab_size"]}_learning_curves.png')
            shutil.copy(source, target)
            images.append(f'![vocab {table["vocab_size"]}]({os.path.relpath(os.path.abspath(target), md_dir)})')
    coverage = ', '.join(f'{t["vocab_size"]}: {100 * t["vocabulary_coverage"]:.1f}%' for t in results['tables'])
    converged = ' to convergence' if config.early_stopping_patience else ''
    vocabularies = ', '.join(str(t['vocab_size']) for t in results['tables'])
    lines = [
        f'## FedRecon Table 2{converged}: next-word prediction, {results["dataset"]}, vocabulary {vocabularies}',
        '',
        f'Command: `{command}`',
        '',
        f'Data: {results["source"]}. Vocabulary coverage of train tokens: {coverage}. '
        f'{config.total_rounds} rounds x {config.clients_per_round} clients; model embedding {config.embedding_dim}, '
        f'LSTM {config.lstm_units}; evaluated on the query sets (second half in time order) of held-out clients. '
        f'Mean (+- standard deviation) over seeds {seeds}'
        + (
            f'; training early-stopped after {config.early_stopping_patience} validation evaluations (every '
            f'{config.rounds_per_eval} rounds) without a higher accuracy (no OOV/EOS), tested with the best '
            "validation round's model"
            if config.early_stopping_patience
            else ''
        )
        + '.',
    ]
    if FLAGS.notes:
        lines += ['', FLAGS.notes]
    for metric, title in (
        ('accuracy_no_oov_no_eos', 'Accuracy without OOV and EOS targets (%)'),
        ('accuracy_no_oov', 'Accuracy without OOV targets (%)'),
        ('accuracy', 'Accuracy over all targets (%)'),
    ):
        lines += ['', f'{title}:', '', nwp_task.format_table(results['tables'], metric)]
    lines += [
        '',
        'Communication per client per round, measured on the values broadcast and aggregated '
        '(scalars = model parameters; the aggregated update also carries its 4-byte weight):',
        '',
        communication_table(results['tables']),
    ]
    lines += ['', *images, '', f'Machine-readable: `{os.path.join(FLAGS.results_dir, name + ".json")}`.']
    program.replace_marked_section(FLAGS.results_md, name, '\n'.join(lines))
    print(nwp_task.format_table(results['tables']))


if __name__ == '__main__':
    app.run(main)
