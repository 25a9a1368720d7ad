"""Everything an experiment reports, written under one output directory.

Layout of `ExperimentOutputs(root_dir, run_name)`:

    root_dir/run_name/metrics.csv          per-round metrics (tff.program.CSVFileReleaseManager)
    root_dir/run_name/tensorboard/         the same as TensorBoard summaries
    root_dir/run_name/checkpoints/         resumable program state (tff.program.FileProgramStateManager)
    root_dir/run_name/<name>.json          hyperparameters, final results
    root_dir/run_name/learning_curve.png   plots
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import cast

import numpy as np
import tensorflow_federated as tff

from fedpersonal import faults
from fedpersonal.program import output_dir


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = '') -> dict[str, float]:
    """Flattens nested metric mappings into `{'a/b/c': float}` (scalars only)."""
    flat = {}
    for key, value in metrics.items():
        name = f'{prefix}{key}'
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, f'{name}/'))
        else:
            array = np.asarray(value)
            if array.ndim == 0 and array.dtype.kind in 'fiub':
                flat[name] = float(array)
    return flat


def run_coroutine(coroutine: Any) -> Any:
    """Runs `coroutine` (e.g. a `tff.program` manager's save or load) to completion and returns its result.

    `asyncio.run`, except under a running event loop (a Jupyter kernel, an async application), where
    `asyncio.run` refuses to start: the coroutine then runs on its own loop in a helper thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value


NON_FINITE_KEY = 'non_finite'
"""The top-level key of a `write_json` file listing the paths of the non-finite numbers written as null."""


def _finite_jsonable(value: Any, path: str, replaced: list[str]) -> Any:
    """`_to_jsonable(value)` with every non-finite float as None, its path (``rows/0/rmse``) added to `replaced`."""
    if isinstance(value, Mapping):
        return {str(k): _finite_jsonable(v, f'{path}/{k}' if path else str(k), replaced) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_jsonable(v, f'{path}/{i}' if path else str(i), replaced) for i, v in enumerate(value)]
    if isinstance(value, np.ndarray):
        return _finite_jsonable(value.tolist(), path, replaced)
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        replaced.append(path)
        return None
    return value


def write_json(path: str, value: Any) -> None:
    """Writes `value` as indented, strictly valid JSON atomically (temp file + rename).

    NaN and infinities (Python or NumPy floats, also inside NumPy arrays), which JSON cannot represent, are written
    as ``null``; when `value` is a mapping and something was replaced, its key ``non_finite`` (`NON_FINITE_KEY`)
    lists the paths of the replaced numbers (``'rows/0/rmse'``: key ``rmse`` of the first element of ``rows``), so
    a reader can tell a diverged metric from a missing one.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_json(os.path.join(d, 'r.json'), {'rows': [{'rmse': float('nan'), 'mae': 0.5}]})
    ...     with open(os.path.join(d, 'r.json')) as f:
    ...         json.load(f)
    {'rows': [{'rmse': None, 'mae': 0.5}], 'non_finite': ['rows/0/rmse']}
    """
    replaced: list[str] = []
    jsonable = _finite_jsonable(value, '', replaced)
    if replaced and isinstance(jsonable, dict):
        earlier = jsonable.get(NON_FINITE_KEY)
        earlier = earlier if isinstance(earlier, list) else []
        jsonable[NON_FINITE_KEY] = earlier + [p for p in replaced if p not in earlier]
    directory = os.path.dirname(os.path.abspath(path))
    with output_dir.writing(directory):
        os.makedirs(directory, exist_ok=True)
        tmp = f'{path}.tmp'
        with open(tmp, 'w') as f:
            json.dump(jsonable, f, indent=2, sort_keys=False, allow_nan=False)
            f.write('\n')
        faults.point('results' if os.path.basename(path) == 'results.json' else 'json')
        os.replace(tmp, path)


def replace_marked_section(path: str, marker: str, section: str) -> None:
    """Replaces (or appends) the part of a Markdown file between `<!-- {marker}:start -->` and `:end -->`.

    Other content of the file is left as it is, so several scripts can each own one section.
    """
    start, end = f'<!-- {marker}:start -->', f'<!-- {marker}:end -->'
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    else:
        text = '# Results\n'
    block = f'{start}\n{section.strip()}\n{end}'
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip('\n') + '\n\n' + block + '\n'
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def _repair_metrics_csv(path: str) -> None:
    """Undoes what a process killed while writing `path` (a `tff.program.CSVFileReleaseManager` file) left: its
    temporary files (``metrics.csv_tempNNNN``: a killed rewrite, the file itself is intact) and a last row without
    its line end (a killed append), which is cut off; a resumed run writes that round again."""
    directory, name = os.path.split(path)
    for entry in os.listdir(directory):
        if entry.startswith(f'{name}_temp'):
            os.remove(os.path.join(directory, entry))
    if not os.path.exists(path):
        return
    with open(path, 'rb+') as f:
        data = f.read()
        if data and not data.endswith(b'\n'):
            f.truncate(data.rfind(b'\n') + 1)
    if os.path.getsize(path) == 0:  # Killed while writing the header: started again.
        os.remove(path)


class ExperimentOutputs:
    """Writers for one run's metrics, checkpoints, JSON files and plots.

    Args:
      root_dir: The output directory the user named.
      run_name: Sub-directory for this run (e.g. one configuration).
    """

    def __init__(self, root_dir: str, run_name: str):
        self.directory = os.path.join(root_dir, run_name)
        self.metrics_csv = os.path.join(self.directory, 'metrics.csv')
        with output_dir.writing(self.directory):
            os.makedirs(self.directory, exist_ok=True)
            _repair_metrics_csv(self.metrics_csv)
            self._csv = tff.program.CSVFileReleaseManager(self.metrics_csv, key_fieldname='round')
            self._tensorboard = tff.program.TensorBoardReleaseManager(os.path.join(self.directory, 'tensorboard'))
        self.state_manager = tff.program.FileProgramStateManager(
            os.path.join(self.directory, 'checkpoints'), keep_total=2, keep_first=False
        )

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def release_metrics(self, round_num: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Appends one row (replacing rows at or after `round_num` from an interrupted run)."""
        flat = flatten_metrics(metrics)
        with output_dir.writing(self.directory):
            run_coroutine(self._csv.release(flat, key=round_num))
            faults.point('metrics')
            run_coroutine(self._tensorboard.release(flat, key=round_num))
        return flat

    def write_json(self, name: str, value: Any) -> str:
        path = self.path(name)
        write_json(path, value)
        return path

    def read_metrics(self) -> list[dict[str, float]]:
        """Rows of `metrics.csv` as dicts (empty values dropped)."""
        import csv  # pylint: disable=g-import-not-at-top

        if not os.path.exists(self.metrics_csv):
            return []
        with open(self.metrics_csv) as f:
            return [{k: float(v) for k, v in row.items() if v not in ('', None)} for row in csv.DictReader(f)]

    def median_round_seconds(self) -> float | None:
        """Median `round_seconds` over every round in `metrics.csv`, including those of a resumed earlier run."""
        seconds = [row['round_seconds'] for row in self.read_metrics() if 'round_seconds' in row]
        return float(np.median(seconds)) if seconds else None

    def plot_learning_curve(
        self, keys: Sequence[str], *, filename: str = 'learning_curve.png', title: str | None = None
    ) -> str | None:
        """Plots the given metric columns against rounds; returns the PNG path."""
        return plot_curves({self.directory: self.read_metrics()}, keys, self.path(filename), title=title)


_LEGEND_MARGIN_INCHES = 0.15  # Between the last panel's decorations and a side legend.


def metric_label(key: str) -> str:
    """An axis label for a flat metric key: ``'eval/auc'`` -> ``'auc (validation)'``.

    >>> metric_label('eval/auc'), metric_label('train/loss'), metric_label('rmse')
    ('auc (validation)', 'loss (train)', 'rmse')
    """
    split, _, metric = key.rpartition('/')
    if not split:
        return key
    split = {'eval': 'validation'}.get(split, split.replace('/', ' '))
    return f'{metric} ({split})'


def plot_curves(
    runs: Mapping[str, list[dict[str, float]]],
    keys: Sequence[str],
    path: str,
    *,
    title: str | None = None,
    references: Mapping[str, Mapping[str, float]] | None = None,
) -> str | None:
    """One subplot per metric key (x: round, y: the metric and its split), one line per run; the legend sits
    outside the plots, so it covers no data.

    Args:
      runs: Run name -> its metric rows (each with a ``'round'``).
      keys: Flat metric keys to plot (keys no run has are skipped).
      path: The PNG written.
      title: The figure's title (default: ``'Metrics per round'``).
      references: Optional name -> {key: value} drawn as dashed horizontal lines, e.g. a centralized model's
        value at its selected epoch (trained in epochs, not rounds).
    """
    import matplotlib  # pylint: disable=g-import-not-at-top

    references = references or {}
    keys = [
        k
        for k in keys
        if any(k in row for rows in runs.values() for row in rows) or any(k in r for r in references.values())
    ]
    if not keys:
        return None
    fig, axes = new_figure(1, len(keys), figsize=(4.6 * len(keys) + 2.2, 3.6), squeeze=False)
    # A distinct (colour, line style) per run: the default cycle repeats after 10 colours.
    count = len(runs) + len(references)
    cmap = colormap('tab10' if count <= 10 else 'tab20', 10 if count <= 10 else 20)
    assert isinstance(cmap, matplotlib.colors.ListedColormap)  # tab10 and tab20 are lists of colours.
    # A tuple of RGB tuples (the stubs type ListedColormap.colors as any colour specification).
    colours = cast(Sequence[Any], cmap.colors)
    styles = ['-', '--', ':', '-.']
    for ax, key in zip(axes[0], keys):
        for i, (label, rows) in enumerate(runs.items()):
            points = [(row['round'], row[key]) for row in rows if key in row and 'round' in row]
            if points:
                xs, ys = zip(*points)
                ax.plot(
                    xs,
                    ys,
                    marker='.' if len(xs) < 30 else None,
                    label=os.path.basename(str(label)),
                    color=colours[i % len(colours)],
                    linestyle=styles[(i // len(colours)) % len(styles)],
                )
        for j, (label, values) in enumerate(references.items()):
            if key in values:
                colour = colours[(len(runs) + j) % len(colours)]
                ax.axhline(values[key], color=colour, linestyle='--', linewidth=1.2, label=str(label))
        ax.set_xlabel('round')
        ax.set_ylabel(metric_label(key))
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:  # Runs absent from the first subplot still get a legend entry.
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    return save_figure_with_side_legend(
        fig, handles, labels, path, legend_inches=2.0, title=title or 'Metrics per round'
    )


def save_figure_with_side_legend(
    fig: Any,
    handles: Sequence[Any],
    labels: Sequence[str],
    path: str,
    *,
    legend_inches: float,
    title: str | None = None,
) -> str:
    """`save_figure` with one legend for all panels to their right, in a strip of the figure kept free of axes, so
    that it covers no data.

    The strip is `legend_inches` wide, or as wide as the legend is (measured) when that is wider: then the figure
    widens by the difference, so long labels neither overlap the last panel nor shrink the panels.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top

    renderer = FigureCanvasAgg(fig).get_renderer()  # What savefig draws with, to measure the legend.
    legend = fig.legend(list(handles), list(labels), fontsize=8, loc='center right', frameon=False)
    needed = legend.get_window_extent(renderer).width / fig.dpi + _LEGEND_MARGIN_INCHES
    width, height = fig.get_size_inches()
    if needed > legend_inches:
        fig.set_size_inches(width + needed - legend_inches, height)
        legend_inches = needed
    fig.tight_layout(rect=(0.0, 0.0, 1.0 - legend_inches / fig.get_size_inches()[0], 0.9 if title else 1.0))
    return save_figure(fig, path, title=title, tight_layout=False)


def new_figure(*args: Any, figsize: tuple[float, float], dpi: float | None = None, **subplots: Any) -> tuple[Any, Any]:
    """``(figure, axes)`` for a plot written to a file (`save_figure`), like `pyplot.subplots`.

    A `matplotlib.figure.Figure` made without pyplot: writing plots never switches the process's matplotlib backend
    nor registers figures with pyplot, so a notebook's inline plots keep working after a run wrote its own.
    """
    from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

    figure = Figure(figsize=figsize, dpi=dpi)
    return figure, figure.subplots(*args, **subplots)


def colormap(name: str, colours: int) -> Any:
    """Matplotlib's colormap `name` resampled to `colours` entries (`pyplot.get_cmap(name, colours)`)."""
    import matplotlib  # pylint: disable=g-import-not-at-top

    return matplotlib.colormaps[name].resampled(colours)


def save_figure(fig: Any, path: str, *, title: str | None = None, tight_layout: bool = True) -> str:
    """Writes a matplotlib figure as a PNG (creating its directory) and returns `path`."""
    if title:
        fig.suptitle(title)
    if tight_layout:
        fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
