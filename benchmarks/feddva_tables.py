"""FedDVA's tables for one dataset: personalized classification (both settings) and disentanglement evidence.

  python benchmarks/feddva_tables.py --flagfile=configs/feddva_scaled.flags --dataset=mnist \
      --data_dir=../shared/data/mnist --output_dir=/tmp/feddva_mnist
  python benchmarks/feddva_tables.py --flagfile=configs/feddva_scaled.flags --dataset=fashion_mnist \
      --output_dir=/tmp/feddva_fashion

Runs `fedpersonal.tasks.feddva.run` and writes `docs/results/feddva_<dataset>.json` (rows with `accuracy`,
`client_mean_accuracy`, `client_min_accuracy`, `seconds_per_round`, and the probe accuracies `probe_client_from_c`,
`probe_client_from_z`, `probe_label_from_z`, ...), the PNGs next to it, and the `feddva_<dataset>` section of
`docs/RESULTS.md`.
"""

import dataclasses
import json
import os
import shutil
import sys
import time

from absl import app
from absl import flags
from absl import logging

from fedpersonal import program
from fedpersonal import runtime
from fedpersonal.program import config_flags
from fedpersonal.tasks import feddva
from fedpersonal.tasks import feddva_analysis

_DEFAULTS = {'output_dir': 'output/feddva'}
config_flags.define_flags(feddva.FeddvaConfig, overrides=_DEFAULTS)
flags.DEFINE_string('results_dir', 'docs/results', 'Where the JSON and PNG copies go.')
flags.DEFINE_string(
    'results_md', 'docs/RESULTS.md', 'Markdown results file (its feddva_<dataset> section is replaced).'
)
flags.DEFINE_string('notes', '', 'Extra Markdown (e.g. the reading of the results) appended to the section.')
flags.DEFINE_list(
    'seeds',
    ['0'],
    'Seeds of every row (data allocation, initialization, noise, client sampling); each seed runs in '
    '<output_dir>/seed<k> and a finished seed is read back; rows report the mean and <metric>_std over the seeds.',
)
flags.DEFINE_string(
    'results_name',
    '',
    'Name of the JSON file and the RESULTS.md section (default feddva_<dataset>), e.g. to keep '
    'a converged table beside the scaled one.',
)
flags.DEFINE_bool(
    'rerender',
    False,
    "Do not train: re-read --output_dir (results.json and the runs' metrics.csv), "
    'redraw the accuracy curves and rewrite the JSON and Markdown (the command recorded is the one '
    'without --rerender).',
)
FLAGS = flags.FLAGS

_DATASET_NAMES = {
    'synthetic': 'generated digits',
    'mnist': 'MNIST',
    'fashion_mnist': 'Fashion-MNIST',
    'cifar10': 'CIFAR-10',
}


def rerender(config: feddva.FeddvaConfig) -> dict:
    """The results of a finished run in `config.output_dir`, with the curves re-read from its metrics."""
    with open(os.path.join(config.output_dir, 'results.json')) as f:
        results = json.load(f)
    curves, results['figures']['accuracy_vs_rounds'] = feddva.accuracy_curves(config)
    results['curves'] = {f'{s}/{m}': c for (s, m), c in curves.items()}
    program.write_json(os.path.join(config.output_dir, 'results.json'), results)
    return results


def _selection_text(config: feddva.FeddvaConfig, seeds: list[int]) -> str:
    """How the table's rows were selected and averaged (a sentence, or '.' for a single unselected run)."""
    text = ''
    if config.validation_per_client:
        text += (
            f'; every row at its best validation round ({config.validation_per_client} held-out training images '
            f'per client, evaluated every {config.rounds_per_eval} rounds; training stopped after '
            f'{config.early_stopping_patience} evaluations without improvement, 0: never), tested once there; '
            'the logistic heads, probes and figures analyse the model training stopped at'
        )
    if len(seeds) > 1:
        text += f'; mean +- standard deviation over seeds {seeds}'
    return text + '.'


def _has_checkpoints(output_dir: str) -> bool:
    return any('checkpoints' in dirs for _, dirs, _ in os.walk(output_dir))


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    command = program.command_line(
        'benchmarks/feddva_tables.py', sys.argv[1:], omit=('--rerender', '--norerender', '--notes', '--results_name')
    )
    config = config_flags.config_from_flags(feddva.FeddvaConfig, overrides=_DEFAULTS)
    started, load_before = time.time(), os.getloadavg()[0]
    timing_path = os.path.join(config.output_dir, 'timing.json')
    # Only an invocation that trains from scratch measures the whole run; one that resumes from checkpoints (or
    # re-renders) keeps the measurement of the run that trained, if there is one.
    resumed = FLAGS.rerender or _has_checkpoints(config.output_dir)
    seeds = [int(seed) for seed in FLAGS.seeds]
    seed_config = lambda seed: dataclasses.replace(
        config, seed=seed, output_dir=program.seed_output_dir(config.output_dir, seed)
    )
    std_keys = ('accuracy', 'client_mean_accuracy', 'client_min_accuracy')
    std_keys += tuple(f'local_logistic_{k}_accuracy' for k in ('zc', 'z', 'c'))
    per_seed_keys = ('best_round', 'rounds', 'best_validation_accuracy')
    if FLAGS.rerender:
        for seed in seeds:
            rerender(seed_config(seed))
        results = program.run_seeds(
            rerender, config, seeds, row_key='name', std_keys=std_keys, per_seed_keys=per_seed_keys
        )
    else:
        with runtime.LocalRuntime():
            results = program.run_seeds(
                feddva.run,
                config,
                seeds,
                row_key='name',
                std_keys=std_keys,
                per_seed_keys=per_seed_keys,
            )
    config = seed_config(seeds[0])  # Figures and statistics: the first seed's.
    if resumed:
        timing = None
        if os.path.exists(timing_path):
            with open(timing_path) as f:
                timing = json.load(f)
    else:
        timing = {
            'wall_seconds': time.time() - started,
            'load_average_1min_start': load_before,
            'load_average_1min_end': os.getloadavg()[0],
            'cpu_count': os.cpu_count(),
        }
        program.write_json(timing_path, timing)
    name = FLAGS.results_name or f'feddva_{config.dataset}'
    os.makedirs(FLAGS.results_dir, exist_ok=True)
    images = {}
    for key, path in results['figures'].items():
        if path and os.path.exists(path):
            images[key] = os.path.join(FLAGS.results_dir, f'{name}_{key}.png')
            shutil.copy(path, images[key])
    json_path = os.path.join(FLAGS.results_dir, f'{name}.json')
    program.write_json(
        json_path,
        {
            'command': command,
            'dataset': config.dataset,
            'statistics': results['statistics'],
            'rounds': results['rounds'],
            'config': dataclasses.asdict(config),
            'rows': results['rows'],
            'seeds': seeds,
            'curves': results['curves'],
            'timing': timing,
        },
    )
    table = feddva_analysis.format_tables(results['rows'])
    md_dir = os.path.dirname(os.path.abspath(FLAGS.results_md))
    rel = lambda p: os.path.relpath(os.path.abspath(p), md_dir)
    stats = next(iter(results['statistics'].values()))
    lines = [
        f'## FedDVA{" to convergence" if config.validation_per_client else ""}: '
        f'{_DATASET_NAMES.get(config.dataset, config.dataset)}',
        '',
        f'Command: `{command}`',
        '',
        f'{config.num_clients} clients ({stats["train_examples"] // config.num_clients} training and '
        f'{stats["test_examples"] // config.num_clients} test images each), {config.total_rounds} rounds of '
        f'{config.clients_per_round} clients, batch {config.batch_size}, Adam lr {config.learning_rate:g}; '
        f'FedDVA: {config.decoder_epochs}/{config.z_epochs}/{config.c_epochs} decoder/z/c epochs and '
        f'{config.head_epochs} head epoch(s) per round, z_dim={config.z_dim}, c_dim={config.c_dim}, '
        f"'{config.architecture}' architecture, decoder-phase c from the {config.decoder_c_source}; "
        f'baselines: {config.client_epochs} local epoch(s), Ditto lambda={config.ditto_lambda:g}, '
        f'fine-tuning {config.finetune_epochs} epoch(s). Accuracy: over all test images of all clients, each '
        "classified by that client's model" + _selection_text(config, seeds),
        '',
        table,
    ]
    if timing:
        lines += [
            '',
            f'Whole run (both settings, every method, figures): {timing["wall_seconds"] / 60:.1f} min wall on '
            f'{timing["cpu_count"]} CPU cores (1-minute load average {timing["load_average_1min_start"]:.1f} '
            f'at the start, {timing["load_average_1min_end"]:.1f} at the end).',
        ]
    for key, path in images.items():
        lines += ['', f'![{key}]({rel(path)})']
    if FLAGS.notes:
        lines += ['', FLAGS.notes]
    lines += ['', f'Machine-readable: `{os.path.join(FLAGS.results_dir, name + ".json")}`.']
    program.replace_marked_section(FLAGS.results_md, name, '\n'.join(lines))
    print(table)


if __name__ == '__main__':
    app.run(main)
