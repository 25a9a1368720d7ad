"""FURL's Table 3 shape for one dataset: Global/Personalized x Server/FL, plus the embedding analysis.

  python benchmarks/furl_tables.py --flagfile=configs/furl_synthetic_subreddit.flags --output_dir=output/furl_synth
  python benchmarks/furl_tables.py --flagfile=configs/furl_movielens_likes.flags --data_dir=DIR --output_dir=output/furl_ml
  python benchmarks/furl_tables.py --flagfile=configs/furl_assistments.flags \
      --data_dir=../shared/data/assist-a0910 --output_dir=output/furl_assist

Runs `fedpersonal.tasks.furl_personalization.run` and writes
`docs/results/furl_<dataset>.json` (rows with `auc`/`accuracy`/`loss`/`seconds_per_round`), the learning curves
and the user-embedding projection next to it, and the `furl_<dataset>` section of `docs/RESULTS.md`.
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
from fedpersonal.tasks import furl_personalization

_DEFAULTS = {'output_dir': 'output/furl'}
config_flags.define_flags(furl_personalization.FurlConfig, overrides=_DEFAULTS)
flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds of every row (data split, initialization, client sampling).')
flags.DEFINE_string('results_dir', 'docs/results', 'Where the JSON and PNG copies go.')
flags.DEFINE_string('results_md', 'docs/RESULTS.md', 'Markdown results file (its furl_<dataset> section is replaced).')
FLAGS = flags.FLAGS


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    command = program.command_line('benchmarks/furl_tables.py', sys.argv[1:])
    config = config_flags.config_from_flags(furl_personalization.FurlConfig, overrides=_DEFAULTS)
    seeds = [int(s) for s in FLAGS.seeds]
    with runtime.LocalRuntime():
        results = program.run_seeds(
            furl_personalization.run,
            config,
            seeds,
            row_key='configuration',
            std_keys=('auc', 'accuracy', 'loss', 'default_state_auc', 'default_state_accuracy'),
            per_seed_keys=('best_round', 'rounds', 'best_epoch', 'epochs', 'wall_seconds'),
        )
    config = dataclasses.replace(config, seed=seeds[0], output_dir=program.seed_output_dir(config.output_dir, seeds[0]))
    name = f'furl_{config.dataset}'
    binary = results['statistics'].get('num_classes') == 2
    images = {}
    for source, suffix in (('learning_curves.png', 'learning_curves'), ('user_embeddings.png', 'user_embeddings')):
        path = os.path.join(config.output_dir, source)
        if os.path.exists(path):
            images[suffix] = os.path.join(FLAGS.results_dir, f'{name}_{suffix}.png')
            os.makedirs(FLAGS.results_dir, exist_ok=True)
            shutil.copy(path, images[suffix])
    program.write_json(
        os.path.join(FLAGS.results_dir, f'{name}.json'),
        {
            'command': command,
            'dataset': results['dataset'],
            'statistics': results['statistics'],
            'rounds': results['rounds'],
            'config': dataclasses.asdict(config),
            'rows': results['rows'],
            'embeddings': results.get('embeddings'),
        },
    )
    table = furl_personalization.format_table(results['rows'], binary)
    lines = [
        f'## FURL: {results["dataset"]}',
        '',
        f'Command: `{command}`',
        '',
        f'Mean +- standard deviation over seeds {seeds} (a seed sets the initial weights, the sampled clients and the '
        "server rows' shuffling; the data split is the dataset's own, see above). FL rows: up to "
        f'{results["rounds"]} rounds of {config.clients_per_round} users, {config.client_epochs} local epoch, '
        f'validation every {config.rounds_per_eval} rounds'
        + (
            f', early-stopped after {config.early_stopping_patience} evaluations without a better validation '
            f"{'AUC' if binary else 'accuracy'}. Both are tested with their best validation round's model "
            "(Personalized FL: the server state and every user's private state of that round)."
            if config.early_stopping_patience
            else '.'
        )
        + f' Server rows: centralized training, up to {config.epochs} epochs'
        + (
            f', early-stopped after {config.centralized_patience} epochs without a better validation '
            f'{"AUC" if binary else "accuracy"}'
            if config.centralized_patience
            else ''
        )
        + ", tested with the best epoch's weights (by the same metric). Embeddings and curves: the first seed.",
        '',
        table,
    ]
    if results.get('embeddings'):
        e = results['embeddings']
        lines += [
            '',
            f'User-embedding {e["knn_k"]}-NN overlap between Personalized Server and Personalized FL: '
            f'{e["knn_overlap"]:.3f} (chance {e["knn_chance"]:.3f}).',
        ]
    md_dir = os.path.dirname(os.path.abspath(FLAGS.results_md))
    for suffix, path in images.items():
        lines += ['', f'![{suffix}]({os.path.relpath(os.path.abspath(path), md_dir)})']
    lines += ['', f'Machine-readable: `{os.path.join(FLAGS.results_dir, name + ".json")}`.']
    program.replace_marked_section(FLAGS.results_md, name, '\n'.join(lines))
    print(table)


if __name__ == '__main__':
    app.run(main)
