"""The FedRecon paper's Figure 3: accuracy relative to base FedRecon when varying k_r and k_u.

  python benchmarks/reconstruction_steps_sweep.py --task=movielens \
      --flagfile=configs/movielens_100k_table1.flags --data_dir=DIR --total_rounds=50 --output_dir=output/sweep_ml
  python benchmarks/reconstruction_steps_sweep.py --task=nwp --flagfile=configs/nwp_shakespeare.flags \
      --data_dir=../shared/data/shakespeare --output_dir=output/sweep_nwp

For each k_r in --recon_steps (0 = no reconstruction) FedRecon is trained and
evaluated with exactly k_r reconstruction steps (batches) on the support set
(`recon_steps_max = k_r`, enough epochs to reach it), the update phase as in
the base configuration (with --noretrain_recon_steps the base model is trained
once and k_r applies to the evaluation only); for each k_u in --update_steps,
with exactly k_u update steps. Each run has the same rounds and client sampling. Relative
accuracy = accuracy / accuracy of the base configuration (the flagfile's
settings, run the same way). Metric: `accuracy` (rating accuracy) for
MovieLens, `accuracy_no_oov_no_eos` for next-word prediction (the vocabulary
size is --sweep_vocab_size, default the first of --vocab_sizes).

Writes `docs/results/fedrecon_steps_<dataset>.json`, a PNG next to it and the
`fedrecon_steps_<dataset>` section of `docs/RESULTS.md`.
"""

import dataclasses
import os
import shlex
import sys

from absl import app
from absl import flags
from absl import logging

from fedpersonal import program
from fedpersonal import runtime
from fedpersonal.program import config_flags
from fedpersonal.tasks import movielens_mf
from fedpersonal.tasks import next_word_prediction as nwp_task

_DEFAULTS = {'output_dir': 'output/fedrecon_steps'}
config_flags.define_flags(movielens_mf.MovieLensMFConfig, overrides=_DEFAULTS)
config_flags.define_flags(nwp_task.NextWordPredictionConfig, overrides=_DEFAULTS)
flags.DEFINE_enum('task', 'nwp', ['nwp', 'movielens'], 'Which FedRecon task to sweep.')
flags.DEFINE_list('recon_steps', ['0', '1', '2', '5', '10'], 'k_r values.')
flags.DEFINE_list('update_steps', ['1', '2', '5', '10'], 'k_u values.')
flags.DEFINE_integer('sweep_vocab_size', None, 'NWP vocabulary size (default: first of --vocab_sizes).')
flags.DEFINE_bool(
    'retrain_recon_steps',
    True,
    'Train FedRecon anew for every k_r (the paper); if false, the base model is trained once and only '
    'the evaluation uses k_r reconstruction steps (1 training instead of 5).',
)
flags.DEFINE_string('results_dir', 'docs/results', 'Where the JSON and PNG go.')
flags.DEFINE_string('results_md', 'docs/RESULTS.md', 'Markdown results file.')
FLAGS = flags.FLAGS


def _settings(base_split):
    """(name, kind, steps, split) for the base, every k_r and every k_u."""
    out = [('base', 'base', None, base_split)]
    for k in (int(v) for v in FLAGS.recon_steps):
        out.append(
            (
                f'k_r={k}',
                'recon_steps',
                k,
                dataclasses.replace(base_split, recon_epochs=max(k, base_split.recon_epochs, 1), recon_steps_max=k),
            )
        )
    for k in (int(v) for v in FLAGS.update_steps):
        out.append(
            (
                f'k_u={k}',
                'update_steps',
                k,
                dataclasses.replace(base_split, post_recon_epochs=max(k, 1), post_recon_steps_max=k),
            )
        )
    return out


def _sweep(base_split, train, evaluate, metric_keys):
    """Runs every setting; `train(split, name) -> (weights, summary)`, `evaluate(weights, split) -> metrics`."""
    rows, base_weights = [], None
    for name, kind, steps, split in _settings(base_split):
        if kind == 'recon_steps' and not FLAGS.retrain_recon_steps:
            weights, summary = base_weights, {}  # k_r varied at evaluation only (see --retrain_recon_steps).
        else:
            try:
                weights, summary = train(split, name.replace('=', ''))
            except program.NonFiniteLossError as error:  # Same hyperparameters for every setting: report it.
                if kind == 'base':
                    raise
                logging.warning('sweep %s diverged: %s', name, error)
                nan = float('nan')
                rows.append({'name': name, 'kind': kind, 'steps': steps, 'diverged_round': error.round_num})
                rows[-1].update(dict.fromkeys(metric_keys, nan))
                continue
        if kind == 'base':
            base_weights = weights
        metrics = evaluate(weights, split)
        rows.append(
            {
                'name': name,
                'kind': kind,
                'steps': steps,
                **{k: metrics[k] for k in metric_keys if k in metrics},
                **{k: v for k, v in summary.items() if k in ('seconds_per_round', 'best_round', 'rounds')},
            }
        )
        logging.info('sweep %s: %s', name, rows[-1])
    return rows


def _run_movielens(output_dir: str):
    config = config_flags.config_from_flags(movielens_mf.MovieLensMFConfig, overrides=_DEFAULTS)
    prepared = movielens_mf.load_data(config)

    def task_for(split):
        return movielens_mf.MovieLensMFTask(
            dataclasses.replace(
                config,
                recon_epochs=split.recon_epochs,
                recon_steps_max=split.recon_steps_max,
                post_recon_epochs=split.post_recon_epochs,
                post_recon_steps_max=split.post_recon_steps_max,
            ),
            prepared,
        )

    def train(split, name):
        """Trains with `split`'s steps, early-stopped on validation RMSE (ReconEval with the same steps on the
        validation users, every --rounds_per_eval rounds; with --early_stopping_patience); the best round's
        weights."""
        task = task_for(split)
        process = task.build_fed_recon()
        outputs = program.ExperimentOutputs(output_dir, name)
        validation = lambda w: task.periodic_metrics('recon', w, prepared.user_val, task.personal_dataset_fn)
        state, selection, seconds = movielens_mf.train_process(
            task, process, name, outputs, prepared.user_train, task.personal_dataset_fn, validation
        )
        summary = {'seconds_per_round': seconds, 'best_round': selection['best_round'], 'rounds': selection['rounds']}
        return process.get_model_weights(state), summary

    def evaluate(weights, split):
        return task_for(split).evaluate('recon', weights, prepared.user_test, task_for(split).personal_dataset_fn)[
            'metrics'
        ]

    rows = _sweep(config.split, train, evaluate, ('accuracy', 'rmse'))
    return prepared.description, 'movielens', 'accuracy', rows, config.total_rounds


def _run_nwp(output_dir: str):
    config = config_flags.config_from_flags(nwp_task.NextWordPredictionConfig, overrides=_DEFAULTS)
    vocab_size = FLAGS.sweep_vocab_size or config.vocab_sizes[0]
    corpus = nwp_task.load_corpus(config)
    task = nwp_task.NextWordPredictionTask(config, corpus, vocab_size)
    rows = _sweep(
        config.split,
        lambda split, name: nwp_task.train_fed_recon(task, split, name, output_dir),
        lambda weights, split: nwp_task.evaluate_fed_recon(task, weights, split),
        ('accuracy', 'accuracy_no_oov', 'accuracy_no_oov_no_eos', 'loss'),
    )
    dataset = f'{corpus.name}, vocabulary {vocab_size}, {config.num_oov_buckets} OOV buckets'
    return dataset, config.dataset, 'accuracy_no_oov_no_eos', rows, config.total_rounds


def _plot(rows, metric: str, title: str, path: str) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, kind, label in (
        (axes[0], 'recon_steps', 'reconstruction steps $k_r$'),
        (axes[1], 'update_steps', 'client update steps $k_u$'),
    ):
        points = sorted(
            (r['steps'], r['relative_accuracy']) for r in rows if r['kind'] == kind and r.get('diverged_round') is None
        )
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], 'o-')
        ax.axhline(1.0, color='grey', lw=0.8, ls='--')
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f'{metric} / base')
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    command = 'python benchmarks/reconstruction_steps_sweep.py ' + ' '.join(shlex.quote(a) for a in sys.argv[1:])
    output_dir = FLAGS.output_dir
    with runtime.LocalRuntime():
        if FLAGS.task == 'movielens':
            dataset, key, metric, rows, rounds = _run_movielens(output_dir)
        else:
            dataset, key, metric, rows, rounds = _run_nwp(output_dir)
    base = next(r for r in rows if r['kind'] == 'base')[metric]
    for row in rows:
        row['relative_accuracy'] = row[metric] / base if base else float('nan')
    name = f'fedrecon_steps_{key}'
    os.makedirs(FLAGS.results_dir, exist_ok=True)
    png = os.path.join(FLAGS.results_dir, f'{name}.png')
    _plot(rows, metric, f'FedRecon steps sweep: {dataset}', png)
    program.write_json(
        os.path.join(FLAGS.results_dir, f'{name}.json'),
        {
            'command': command,
            'dataset': dataset,
            'metric': metric,
            'rounds': rounds,
            'retrain_recon_steps': FLAGS.retrain_recon_steps,
            'rows': rows,
        },
    )
    selected = any(r.get('best_round') is not None for r in rows)
    extra = [k for k in ('rmse',) if all(k in r for r in rows)]
    header = ['setting', metric, *extra, 'relative to base', *(['best round (of)'] if selected else []), 's/round']
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    how = (
        'each k_r / k_u is used in training and in evaluation'
        if FLAGS.retrain_recon_steps
        else 'k_u is used in training and evaluation; k_r only in evaluation (the base model is trained once with the '
        'base reconstruction)'
    )
    for r in rows:
        spr = r.get('seconds_per_round')
        if r.get('diverged_round') is not None:
            cells = [r['name'], f'diverged (non-finite loss in round {r["diverged_round"]})', *([''] * len(extra)), '']
            lines.append('| ' + ' | '.join([*cells, *([''] if selected else []), '']) + ' |')
            continue
        cells = [r['name'], f'{r[metric]:.4f}', *(f'{r[k]:.4f}' for k in extra), f'{r["relative_accuracy"]:.3f}']
        if selected:
            cells.append(f'{r["best_round"]} ({r["rounds"]})' if r.get('best_round') is not None else '')
        lines.append('| ' + ' | '.join([*cells, '' if spr is None else f'{spr:.2f}']) + ' |')
    budget = f'{rounds} rounds per trained setting'
    if selected:
        selection = (
            "validation RMSE (ReconEval with the setting's steps on the validation users)"
            if FLAGS.task == 'movielens'
            else "validation accuracy without OOV/EOS (ReconEval with the setting's steps on --eval_clients "
            'validation clients)'
        )
        budget = (
            f'up to {rounds} rounds per trained setting, early-stopped on {selection}; tested once with the best '
            "validation round's weights"
        )
    md_dir = os.path.dirname(os.path.abspath(FLAGS.results_md))
    section = '\n'.join(
        [
            f'## FedRecon Figure 3: reconstruction and update steps, {dataset}',
            '',
            f'Command: `{command}`',
            '',
            f'{budget}; {how}; evaluation on held-out clients; relative = {metric} / base.',
            '',
            *lines,
            '',
            f'![steps sweep]({os.path.relpath(os.path.abspath(png), md_dir)})',
            '',
            f'Machine-readable: `{os.path.join(FLAGS.results_dir, name + ".json")}`.',
        ]
    )
    program.replace_marked_section(FLAGS.results_md, name, section)
    print('\n'.join(lines))


if __name__ == '__main__':
    app.run(main)
