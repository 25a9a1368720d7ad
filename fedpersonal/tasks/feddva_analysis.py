"""FedDVA experiment: encodings, local probes, the disentanglement analysis, curves and tables.

Split from `fedpersonal.tasks.feddva` (which trains the methods) so each module keeps one job.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from fedpersonal import program
from fedpersonal.algorithms import feddva
from fedpersonal.data import federated_images
from fedpersonal.evaluation import disentanglement
from fedpersonal.models import feddva_models
from fedpersonal.tasks.feddva_config import METHODS as METHODS
from fedpersonal.tasks.feddva_config import SETTINGS as SETTINGS
from fedpersonal.tasks.feddva_setting import EVAL_BATCH
from fedpersonal.tasks.feddva_setting import SETTING_NAMES as SETTING_NAMES
from fedpersonal.tasks.feddva_setting import FeddvaTask

METHOD_NAMES = {
    'feddva': 'FedDVA head on [z, c]',
    'feddva_tuned': 'FedDVA, encoders tuned with the head',
    'fedavg': 'FedAvg',
    'fedavg_ft': 'FedAvg + fine-tuning',
    'ditto': 'Ditto',
}


def load_curves(output_dir: str, settings, methods) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """The evaluation's accuracy against rounds of each (setting, method), from the runs' `metrics.csv` files
    (the validation accuracy when the runs select on validation, else the test accuracy; FedAvg + fine-tuning is
    evaluated in the FedAvg run, as `eval/ft_accuracy`)."""
    import csv  # pylint: disable=g-import-not-at-top

    curves = {}
    for setting in settings:
        for method in methods:
            run, key = ('fedavg', 'eval/ft_accuracy') if method == 'fedavg_ft' else (method, 'eval/accuracy')
            path = os.path.join(output_dir, setting, run, 'metrics.csv')
            if not os.path.exists(path):
                continue
            with open(path) as f:
                rows = [r for r in csv.DictReader(f) if r.get(key) not in (None, '') and r.get('round')]
            curves[(setting, method)] = [(int(float(r['round'])), float(r[key])) for r in rows]
    return curves


def encode_clients(task: FeddvaTask, model: feddva_models.DualVae, weights, states) -> dict[str, dict[str, Any]]:
    """Per client and split: (mu_z, mu_c, labels), each client encoding with its own batch-norm statistics."""
    encode = tf.function(
        lambda x: model.encode(x, training=False), input_signature=[tf.TensorSpec([None, *task.arch.image_shape])]
    )
    result: dict[str, dict[str, Any]] = {}
    for cid in task.data.client_ids:
        feddva.set_weights(model, weights, states[cid])
        result[cid] = {}
        for split, source in (('train', task.data.train), ('test', task.data.test)):
            images, labels = source[cid]
            parts = [[t.numpy() for t in encode(images[i : i + EVAL_BATCH])] for i in range(0, len(images), EVAL_BATCH)]
            result[cid][split] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[2] for p in parts]), labels)
    return result


def local_logistic_heads(task: FeddvaTask, encodings: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Accuracy of per-client logistic-regression heads fitted to convergence on the client's own training
    encodings ([z, c], z only, c only): `local_logistic_{zc,z,c}_accuracy` (example-weighted over clients)."""
    out = {}
    for name, pick in (('zc', lambda z, c: np.concatenate([z, c], 1)), ('z', lambda z, c: z), ('c', lambda z, c: c)):
        correct = total = 0
        for cid in task.data.client_ids:
            (z_tr, c_tr, y_tr), (z_te, c_te, y_te) = encodings[cid]['train'], encodings[cid]['test']
            accuracy = disentanglement.linear_probe_accuracy(
                pick(z_tr, c_tr), y_tr, pick(z_te, c_te), y_te, task.config.seed
            )
            correct, total = correct + accuracy * y_te.size, total + y_te.size
        out[f'local_logistic_{name}_accuracy'] = correct / max(total, 1)
    return out


def analyze_disentanglement(task: FeddvaTask, context: dict[str, Any], output_dir: str) -> dict[str, Any]:
    """Probes, manifold grids and projections of a trained FedDVA model (each client encodes with its own
    batch-norm statistics and decodes with its own decoder)."""
    cfg, data = task.config, task.data
    model, weights, states, encodings = context['model'], context['weights'], context['states'], context['encodings']
    decode = tf.function(lambda z, c: tf.sigmoid(model.decode(z, c, training=False)))
    marks = data.mark_types()
    collected: dict[str, dict[str, list[np.ndarray]]] = {
        'train': {k: [] for k in ('z', 'c', 'client', 'label', 'mark')},
        'test': {k: [] for k in ('z', 'c', 'client', 'label', 'mark')},
    }
    codes = {}
    for i, cid in enumerate(data.client_ids):
        for split in ('train', 'test'):
            mu_z, mu_c, labels = encodings[cid][split]
            out = collected[split]
            out['z'].append(mu_z)
            out['c'].append(mu_c)
            out['label'].append(labels)
            out['client'].append(np.full(labels.size, i))
            out['mark'].append(np.full(labels.size, marks[i]))
            if split == 'test':
                codes[cid] = (mu_z, mu_c, labels)
    sets = {s: {k: np.concatenate(v) for k, v in d.items()} for s, d in collected.items()}
    report = disentanglement.probe_report(sets['train'], sets['test'], seed=cfg.seed)

    # Manifold grids: rows = z of test images with distinct labels (from the first client), columns = c of the
    # panel client's own test images, decoded by the panel client's decoder.
    n = cfg.grid_size
    z_ref, _, labels_ref = codes[data.client_ids[0]]
    order = [int(np.flatnonzero(labels_ref == k)[0]) for k in np.unique(labels_ref)][:n]
    order += [i for i in range(len(labels_ref)) if i not in order][: n - len(order)]
    z_rows = z_ref[order]
    panels = []
    for cid in data.client_ids[: min(4, len(data.client_ids))]:
        feddva.set_weights(model, weights, states[cid])
        c_cols = codes[cid][1][:n]
        z_grid = np.repeat(z_rows, len(c_cols), axis=0)
        c_grid = np.tile(c_cols, (len(z_rows), 1))
        images = decode(tf.constant(z_grid), tf.constant(c_grid)).numpy()
        mark_name = federated_images.MARK_TYPES[marks[int(cid)]] if data.marks else 'no marks'
        panels.append(
            (f'client {cid} decoder ({mark_name})', images.reshape(len(z_rows), len(c_cols), *task.arch.image_shape))
        )
    grid_path = disentanglement.plot_manifold_grids(
        panels,
        os.path.join(output_dir, 'manifold.png'),
        title=f'{data.description}: rows vary z (same z in every panel), columns vary c',
    )

    rng = np.random.default_rng(cfg.seed)
    test = sets['test']
    keep = rng.permutation(test['z'].shape[0])[: cfg.projection_points]
    projection_path = disentanglement.plot_projections(
        test['z'][keep],
        test['c'][keep],
        test['client'][keep],
        os.path.join(output_dir, 'projections.png'),
        method=cfg.projection,
        seed=cfg.seed,
        title=f'FedDVA representations of test images: {data.description}',
        also_by=[('label', test['label'][keep])] + ([('mark type', test['mark'][keep])] if data.marks else []),
    )
    return {'probes': report, 'figures': {'manifold': grid_path, 'projections': projection_path}}


def plot_accuracy_curves(
    curves: dict[tuple[str, str], list[tuple[int, float]]], path: str, title: str = '', split: str = 'test'
) -> str:
    """One subplot per setting, one line per method: the evaluation's accuracy (on `split`) against rounds."""
    settings = [s for s in SETTINGS if any(k[0] == s for k in curves)]
    panels = max(1, len(settings))
    fig, axes = program.new_figure(1, panels, figsize=(5.5 * panels + 2.8, 4), squeeze=False)
    lines: dict[str, Any] = {}  # One legend entry per method, beside the panels so that it covers no curve.
    for ax, setting in zip(axes[0], settings):
        for method in METHODS:
            points = curves.get((setting, method))
            if points:
                xs, ys = zip(*points)
                (lines[METHOD_NAMES[method]],) = ax.plot(xs, ys, marker='.', label=METHOD_NAMES[method])
        ax.set_title(SETTING_NAMES[setting])
        ax.set_xlabel('round')
        ax.set_ylabel(f'{split} accuracy')
        ax.grid(alpha=0.3)
    return program.save_figure_with_side_legend(
        fig, list(lines.values()), list(lines), path, legend_inches=2.8, title=title
    )


def _number(value: Any) -> str:
    """A table cell: 4 decimals, or 'n/a' for a missing value (a non-finite metric reads back from JSON as None)."""
    return 'n/a' if value is None else f'{value:.4f}'


def _cell(row: dict[str, Any], key: str) -> str:
    """A metric cell: its value, with ``+- <key>_std`` when the row is a mean over several seeds."""
    seeds = row.get('seeds') or []
    if len(seeds) > 1 and row.get(f'{key}_std') is not None:
        return f'{_number(row.get(key))} +- {row[f"{key}_std"]:.4f}'
    return _number(row.get(key))


def _rounds(row: dict[str, Any]) -> str:
    """'best round / rounds run', per seed when the row has several."""
    runs = (row.get('per_seed') or []) if len(row.get('seeds') or []) > 1 else [row]
    return ', '.join(f'{int(r["best_round"])}/{int(r["rounds"])}' for r in runs if r.get('best_round') is not None)


def format_tables(rows: list[dict[str, Any]]) -> str:
    """Markdown: the classification table (method x setting) and the probe table."""
    classification = [r for r in rows if 'accuracy' in r]
    selected = any('best_round' in r for r in classification)
    lines = [
        '| method | setting | accuracy | client-mean accuracy | worst client | s/round |'
        + (' best round / rounds |' if selected else ''),
        '|---|---|---|---|---|---|' + ('---|' if selected else ''),
    ]
    logistic = [r for r in classification if 'local_logistic_zc_accuracy' in r]
    for r in classification:
        spr = r.get('seconds_per_round')
        cells = [_cell(r, key) for key in ('accuracy', 'client_mean_accuracy', 'client_min_accuracy')]
        lines.append(
            f'| {METHOD_NAMES[r["method"]]} | {SETTING_NAMES[r["setting"]]} | {" | ".join(cells)} | '
            f'{"" if spr is None else f"{spr:.2f}"} |' + (f' {_rounds(r)} |' if selected else '')
        )
    if logistic:
        lines += [
            '',
            'FedDVA representations with per-client logistic-regression heads fitted to convergence on the '
            "client's own training encodings (accuracy on its test images):",
            '',
            '| method | setting | [z, c] | z only | c only |',
            '|---|---|---|---|---|',
        ]
        for r in logistic:
            cells = [_cell(r, f'local_logistic_{k}_accuracy') for k in ('zc', 'z', 'c')]
            lines.append(f'| {METHOD_NAMES[r["method"]]} | {SETTING_NAMES[r["setting"]]} | {" | ".join(cells)} |')
    probes = [r for r in rows if any(k.startswith('probe_') for k in r)]
    for r in probes:
        lines += [
            '',
            f"Linear probes, {r['name']} (logistic regression on mu; trained on the clients' training "
            'encodings, scored on their test encodings):',
            '',
            '| target | from c | from z | majority baseline |',
            '|---|---|---|---|',
        ]
        for target in ('client', 'label', 'mark'):
            if f'probe_{target}_from_c' in r:
                lines.append(
                    f'| {target} | {_number(r[f"probe_{target}_from_c"])} | {_number(r[f"probe_{target}_from_z"])} | '
                    f'{_number(r[f"chance_{target}"])} |'
                )
    return '\n'.join(lines)
