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

With --seeds=0,1,2 the whole sweep runs once per seed (each seed's runs in
``<output_dir>/seed<k>``, a finished seed read back from its ``results.json``,
an interrupted one resumed from its checkpoints), and every setting is reported
as mean +- standard deviation over the seeds (relative accuracy: each seed's
accuracy over the same seed's base); a setting that diverged in some seeds is
averaged over the others and the table says in how many it diverged.

Writes `docs/results/fedrecon_steps_<dataset>.json`, a PNG next to it and the
`fedrecon_steps_<dataset>` section of `docs/RESULTS.md`.
"""

import dataclasses
import math
import os
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
flags.DEFINE_list(
    'seeds',
    ['0'],
    "Seeds of the whole sweep (initialization, client sampling); each seed's runs in <output_dir>/seed<k>.",
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


_PER_SEED = ('best_round', 'rounds', 'seconds_per_round', 'diverged_round')
# The metrics each task's sweep reports (and averages over seeds).
_METRIC_KEYS = {
    'movielens': ('accuracy', 'rmse'),
    'nwp': ('accuracy', 'accuracy_no_oov', 'accuracy_no_oov_no_eos', 'loss'),
}


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
                rows.append({'name': name, 'kind': kind, 'steps': steps, **dict.fromkeys(_PER_SEED)})
                rows[-1].update(dict.fromkeys(metric_keys, nan), diverged_round=error.round_num)
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
                **{k: summary.get(k) for k in _PER_SEED},
            }
        )
        logging.info('sweep %s: %s', name, rows[-1])
    return rows


def _run_movielens(config: movielens_mf.MovieLensMFConfig):
    output_dir = config.output_dir
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

    rows = _sweep(config.split, train, evaluate, _METRIC_KEYS['movielens'])
    return prepared.description, 'movielens', 'accuracy', rows, config.total_rounds


def _run_nwp(config: nwp_task.NextWordPredictionConfig):
    output_dir = config.output_dir
    vocab_size = FLAGS.sweep_vocab_size or config.vocab_sizes[0]
    corpus = nwp_task.load_corpus(config)
    task = nwp_task.NextWordPredictionTask(config, corpus, vocab_size)
    rows = _sweep(
        config.split,
        lambda split, name: nwp_task.train_fed_recon(task, split, name, output_dir),
        lambda weights, split: nwp_task.evaluate_fed_recon(task, weights, split),
        _METRIC_KEYS['nwp'],
    )
    dataset = f'{corpus.name}, vocabulary {vocab_size}, {config.num_oov_buckets} OOV buckets'
    return dataset, config.dataset, 'accuracy_no_oov_no_eos', rows, config.total_rounds


def _plot(rows, metric: str, title: str, path: str, label: str) -> None:
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, kind, xlabel in (
        (axes[0], 'recon_steps', 'reconstruction steps $k_r$'),
        (axes[1], 'update_steps', 'client update steps $k_u$'),
    ):
        points = sorted(
            (r['steps'], r['relative_accuracy'], r.get('relative_accuracy_std', 0.0))
            for r in rows
            if r['kind'] == kind and _finite(r['relative_accuracy'])
        )
        if points:
            xs, ys, errors = zip(*points)
            ax.errorbar(xs, ys, yerr=errors, fmt='o-', capsize=3, label=label)
            ax.legend(loc='best', fontsize=8)
        diverged = [f'{r["steps"]:g}' for r in rows if r['kind'] == kind and not _finite(r['relative_accuracy'])]
        if diverged:  # Not plotted: say so on the axes.
            ax.text(0.02, 0.02, f'diverged: {", ".join(diverged)}', transform=ax.transAxes, fontsize=8, va='bottom')
        ax.axhline(1.0, color='grey', lw=0.8, ls='--')
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f'{metric} / base')
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _sweep_one_seed(config):
    """The whole sweep with ``config.seed``; writes and returns ``results.json`` in ``config.output_dir``."""
    run = _run_movielens if FLAGS.task == 'movielens' else _run_nwp
    dataset, key, metric, rows, rounds = run(config)
    base = next(r for r in rows if r['kind'] == 'base')[metric]
    for row in rows:
        row['relative_accuracy'] = row[metric] / base if base else float('nan')
    results = {'dataset': dataset, 'key': key, 'metric': metric, 'rounds': rounds, 'rows': rows}
    program.write_json(os.path.join(config.output_dir, 'results.json'), results)
    return results


def _cell(row, key, seeds, digits=4):
    """``mean +- std`` over the seeds (the mean alone for one seed)."""
    if not _finite(row.get(key)):
        return ''
    return f'{row[key]:.{digits}f}' + (f' +- {row[key + "_std"]:.{digits}f}' if len(seeds) > 1 else '')


def _table(rows, metric: str, seeds) -> tuple[list[str], bool]:
    selected = any(_finite(r.get('best_round')) for r in rows)
    extra = [k for k in ('rmse',) if all(k in r for r in rows)]
    header = ['setting', metric, *extra, 'relative to base', *(['best round (of)'] if selected else []), 's/round']
    if len(seeds) > 1:
        header.append('diverged (seeds)')
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for r in rows:
        diverged = [
            (s, run['diverged_round']) for s, run in zip(seeds, r['per_seed']) if run.get('diverged_round') is not None
        ]
        trained = len(diverged) < len(seeds)  # In at least one seed.
        if trained:
            cells = [r['name'], _cell(r, metric, seeds), *(_cell(r, k, seeds) for k in extra)]
            cells.append(_cell(r, 'relative_accuracy', seeds, 3))
        else:
            rounds = ', '.join(str(round_num) for _, round_num in diverged)
            cells = [r['name'], f'diverged (non-finite loss in round {rounds})', *([''] * len(extra)), '']
        if selected:
            runs = [run for run in r['per_seed'] if _finite(run.get('best_round'))] if trained else []
            cells.append(' / '.join(f'{run["best_round"]} ({run["rounds"]})' for run in runs))
        spr = r.get('seconds_per_round')
        cells.append(f'{spr:.2f}' if trained and _finite(spr) else '')
        if len(seeds) > 1:
            cells.append(', '.join(f'seed {s}: round {round_num}' for s, round_num in diverged))
        lines.append('| ' + ' | '.join(cells) + ' |')
    return lines, selected


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    command = program.command_line('benchmarks/reconstruction_steps_sweep.py', sys.argv[1:])
    config_cls = movielens_mf.MovieLensMFConfig if FLAGS.task == 'movielens' else nwp_task.NextWordPredictionConfig
    config = config_flags.config_from_flags(config_cls, overrides=_DEFAULTS)
    seeds = [int(s) for s in FLAGS.seeds]
    with runtime.LocalRuntime():
        results = program.run_seeds(
            _sweep_one_seed,
            config,
            seeds,
            row_key='name',
            std_keys=(*_METRIC_KEYS[FLAGS.task], 'relative_accuracy'),
            per_seed_keys=_PER_SEED,
        )
    dataset, key, metric, rows, rounds = (results[k] for k in ('dataset', 'key', 'metric', 'rows', 'rounds'))
    name = f'fedrecon_steps_{key}'
    os.makedirs(FLAGS.results_dir, exist_ok=True)
    png = os.path.join(FLAGS.results_dir, f'{name}.png')
    label = f'mean +- std over seeds {seeds}' if len(seeds) > 1 else f'seed {seeds[0]}'
    _plot(rows, metric, f'FedRecon steps sweep: {dataset}', png, label)
    program.write_json(
        os.path.join(FLAGS.results_dir, f'{name}.json'),
        {
            'command': command,
            'dataset': dataset,
            'metric': metric,
            'rounds': rounds,
            'retrain_recon_steps': FLAGS.retrain_recon_steps,
            'seeds': seeds,
            'rows': rows,
        },
    )
    lines, selected = _table(rows, metric, seeds)
    how = (
        'each k_r / k_u is used in training and in evaluation'
        if FLAGS.retrain_recon_steps
        else 'k_u is used in training and evaluation; k_r only in evaluation (the base model is trained once with the '
        'base reconstruction)'
    )
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
    over = (
        f'Mean +- standard deviation over seeds {seeds} (relative: each seed over its own base; best rounds per seed)'
        if len(seeds) > 1
        else f'Seed {seeds[0]}'
    )
    md_dir = os.path.dirname(os.path.abspath(FLAGS.results_md))
    section = '\n'.join(
        [
            f'## FedRecon Figure 3: reconstruction and update steps, {dataset}',
            '',
            f'Command: `{command}`',
            '',
            f'{budget}; {how}; evaluation on held-out clients; relative = {metric} / base. {over}.',
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
