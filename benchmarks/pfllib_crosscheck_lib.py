"""The pure parts of `benchmarks/pfllib_crosscheck.py`: methods, weight layouts, rows, verdicts and fedpersonal's run.

No absl flags are defined here (a test imports it beside the package's flags; `pfllib_crosscheck.py` defines the
binary's): see that module's docstring for what the harness does.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
TOLERANCE = 1e-3
LAYERS = ('conv1', 'conv2', 'fc1', 'fc')  # fedavg_cnn's layers with weights, as PFLlib's FedAvgCNN's parameters.
FLATTEN_CHW = (64, 4, 4)  # fc1's inputs: PyTorch flattens (channel, row, column), Keras (row, column, channel).
ROW_KEYS = (
    'method',
    'partition',
    'mode',
    'rounds',
    'max_abs_weight_diff',
    'accuracy_fedpersonal',
    'accuracy_pfllib',
    'verdict',
    'pfllib_commit',
)


@dataclasses.dataclass(frozen=True)
class PfllibMethod:
    """How PFLlib runs a benchmark method: its server, whether ``main.py`` splits the model into base and head,
    the client attribute holding the model a client predicts with, its arguments from fedpersonal's config, and a
    known reason the two differ (used only when the weights differ beyond `TOLERANCE`)."""

    server_module: str
    server_class: str
    head_split: bool = False
    client_model: str = 'model'
    args: Any = lambda config: {}
    explanation: str | None = None
    statistical_explanation: str | None = None  # Why statistical mode's accuracies differ beyond its rule.


METHODS: dict[str, PfllibMethod] = {
    'fedavg': PfllibMethod('serveravg', 'FedAvg', head_split=True),
    'fedprox': PfllibMethod('serverprox', 'FedProx', args=lambda c: {'mu': c.fedprox_mu}),
    'per_fedavg': PfllibMethod('serverperavg', 'PerAvg'),
    'ditto': PfllibMethod(
        'serverditto',
        'Ditto',
        client_model='model_per',
        args=lambda c: {'mu': c.ditto_lambda, 'plocal_epochs': c.personal_epochs},
    ),
    'fedper': PfllibMethod('serverper', 'FedPer', head_split=True),
    'fedrep': PfllibMethod(
        'serverrep', 'FedRep', head_split=True, args=lambda c: {'plocal_epochs': c.fedrep_head_epochs}
    ),
    'lg_fedavg': PfllibMethod('serverlg', 'LG_FedAvg', head_split=True),
    'pfedme': PfllibMethod(
        'serverpFedMe',
        'pFedMe',
        client_model='personalized_params',
        args=lambda c: {
            'lamda': c.pfedme_lambda,
            'K': c.pfedme_k,
            'p_learning_rate': c.pfedme_personal_learning_rate,
            'beta': 1.0,  # fedpersonal's server step (PFLlib's main.py default: 0.0).
        },
        explanation=(
            'PFLlib system/flcore/clients/clientpFedMe.py:81 (test_metrics_personalized) evaluates '
            "personalized_params, which is the model's own parameter list (optimizers/fedoptimizer.py:47 returns "
            "group['params']); train() ends with update_parameters(self.model, self.local_params) (line 68) and "
            "set_parameters (lines 76-77) overwrites them with the received global model, so PFLlib's personalized "
            'model is the global one (its client weights equal its global weights exactly here), not theta. '
            "fedpersonal predicts with the client's last theta (the paper's). The global weights agree."
        ),
        statistical_explanation=(
            "As exact mode found (clientpFedMe.py:81 evaluates personalized_params, the model's own parameters, "
            'which set_parameters at lines 76-77 overwrote with the received global model): PFLlib scores the '
            "global model, whose accuracy under the pathological split rises as FedAvg's does (about 0.6 after 8 "
            "rounds), fedpersonal each client's personalized theta (the paper's); the curves measure different "
            'models.'
        ),
    ),
    'fedala': PfllibMethod(
        'serverala',
        'FedALA',
        args=lambda c: {'eta': c.fedala_eta, 'rand_percent': c.fedala_rand_percent, 'layer_idx': c.fedala_layer_idx},
        explanation=(
            'PFLlib system/flcore/servers/serverala.py:74 send_models calls clientala.py:56 local_initialization, '
            "i.e. utils/ALA.py's adaptive_local_aggregation, which learns W one more epoch (ALA.py:146) before the "
            "round's evaluation, so PFLlib evaluates each client at a start with W learned further; fedpersonal "
            "evaluates the start with the client's current W, not learned further (pfl_benchmark_methods' fedala "
            "row). The global weights and the clients' trained local models agree (the harness prints them)."
        ),
    ),
    'fedbabu': PfllibMethod(
        'serverbabu', 'FedBABU', head_split=True, args=lambda c: {'fine_tuning_epochs': c.finetune_epochs}
    ),
    'fedrod': PfllibMethod('serverrod', 'FedROD', head_split=True, client_model='model,head'),
    'scaffold': PfllibMethod('serverscaffold', 'SCAFFOLD', args=lambda c: {'server_learning_rate': 1.0}),
    'moon': PfllibMethod('servermoon', 'MOON', head_split=True, args=lambda c: {'mu': c.moon_mu, 'tau': c.moon_tau}),
    # FedDBE's client: its model, then its representation bias (client_mean); the mean regularizer's weight is
    # main.py's default 0, as fedpersonal's FedDBE (its PRBM alone).
    'feddbe': PfllibMethod(
        'serverdbe',
        'FedDBE',
        head_split=True,
        client_model='model,client_mean',
        args=lambda c: {
            'kl_weight': 0.0,
            'momentum': 0.1,
        },
    ),
    # FedAMP: no global model (fedpersonal's server keeps the last round's uploads as rows, PFLlib's serveramp.py
    # never aggregates its global_model); each client's own model is PFLlib's `model`, compared alone. The
    # benchmark's default variant 'pfllib' trains on the loss alone, as clientamp.py:189-191, whose proximal term
    # reads `.data` (no gradient).
    'fedamp': PfllibMethod(
        'serveramp',
        'FedAMP',
        args=lambda c: {'alphaK': c.fedamp_alpha, 'sigma': c.fedamp_sigma, 'lamda': c.fedamp_lamda},
    ),
    'apfl': PfllibMethod(
        'serverapfl',
        'APFL',
        client_model='model_per',
        args=lambda c: {'alpha': c.apfl_alpha},
        explanation=(
            'PFLlib system/flcore/clients/clientapfl.py: train() steps the personal model v on its own loss (not on '
            "the mixture's), updates alpha with an extra +0.02*alpha term and then overwrites v with the mixture "
            "alpha*v+(1-alpha)*w; fedpersonal's APFL follows the paper (v trained on the mixed model's loss, alpha by "
            'its gradient alone, v kept).'
        ),
    ),
}


# ----------------------------------------------------------------------------------------- pure parts (tested)
def keras_to_torch(weights: Sequence[np.ndarray], flatten_chw: tuple[int, int, int] = FLATTEN_CHW) -> list[np.ndarray]:
    """Keras weights of a conv/dense stack in PyTorch's layout: conv kernels ``[h, w, in, out] -> [out, in, h, w]``,
    dense kernels transposed, the kernel of the dense layer after the flatten (``prod(flatten_chw)`` inputs) with
    its inputs reordered from Keras' flatten (row, column, channel) to PyTorch's (channel, row, column); biases
    unchanged."""
    out = []
    for w in weights:
        w = np.asarray(w)
        if w.ndim == 4:
            out.append(np.ascontiguousarray(w.transpose(3, 2, 0, 1)))
        elif w.ndim == 2:
            if flatten_chw is not None and w.shape[0] == np.prod(flatten_chw):  # The dense layer after the flatten.
                c, h, wd = flatten_chw
                w = w.reshape(h, wd, c, -1).transpose(2, 0, 1, 3).reshape(c * h * wd, -1)
            out.append(np.ascontiguousarray(w.T))
        else:
            out.append(w.copy())
    return out


def torch_to_keras(weights: Sequence[np.ndarray], flatten_chw: tuple[int, int, int] = FLATTEN_CHW) -> list[np.ndarray]:
    """The inverse of `keras_to_torch`."""
    out = []
    for w in weights:
        w = np.asarray(w)
        if w.ndim == 4:
            out.append(np.ascontiguousarray(w.transpose(2, 3, 1, 0)))
        elif w.ndim == 2:
            w = w.T
            if flatten_chw is not None and w.shape[0] == np.prod(flatten_chw):
                c, h, wd = flatten_chw
                w = w.reshape(c, h, wd, -1).transpose(1, 2, 0, 3).reshape(c * h * wd, -1)
            out.append(np.ascontiguousarray(w))
        else:
            out.append(w.copy())
    return out


def max_abs_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """The largest absolute difference of two equally shaped weight lists (raises on a shape or length mismatch)."""
    if len(a) != len(b):
        raise ValueError(f'{len(a)} weights beside {len(b)}')
    diff = 0.0
    for x, y in zip(a, b):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            raise ValueError(f'shapes {x.shape} and {y.shape}')
        diff = max(diff, float(np.max(np.abs(x - y))) if x.size else 0.0)
    return diff


def weight_diffs(
    global_weights: Sequence[np.ndarray],
    global_layers: Sequence[str],
    their_global: Sequence[np.ndarray],
    clients: Sequence[Sequence[np.ndarray]],
    their_clients: Sequence[Sequence[np.ndarray]],
) -> dict[str, float]:
    """The largest absolute difference of the global weights (``'global'``) and of each client's predicting weights
    (``'client<c>'``), fedpersonal's beside PFLlib's (Keras layout). A PFLlib server holding a whole model (FedPer's,
    LG-FedAvg's, ...) is compared on fedpersonal's `global_layers` alone; with no global layers (FedAMP: the server
    keeps a table of the clients' models, no global model) the clients' own models alone."""
    diffs = {}
    if global_layers:
        if len(their_global) == 2 * len(LAYERS):  # PFLlib's server holds a whole model: its global layers compared.
            their_global = [
                w for layer, pair in zip(LAYERS, zip(their_global[::2], their_global[1::2]))
                if layer in global_layers for w in pair
            ]  # fmt: skip
        diffs['global'] = max_abs_diff(global_weights, their_global)
    elif len(global_weights):
        raise ValueError(f'{len(global_weights)} global weights of no global layer')
    if len(clients) != len(their_clients):
        raise ValueError(f'{len(clients)} clients beside {len(their_clients)}')
    for c, (a, b) in enumerate(zip(clients, their_clients)):
        diffs[f'client{c}'] = max_abs_diff(a, b)
    return diffs


def verdict(diff: float, explanation: str | None) -> tuple[str, str | None]:
    """``('equal', None)`` within `TOLERANCE`; else ``('explained', explanation)`` when a reason is known, or
    ``('unexplained', None)``: a suspected bug on one side. A NaN difference is never equal."""
    if diff <= TOLERANCE:  # False for NaN.
        return 'equal', None
    return ('explained', explanation) if explanation else ('unexplained', None)


def make_row(
    method: str,
    partition: str,
    rounds: int,
    diff: float,
    accuracy_fedpersonal: float,
    accuracy_pfllib: float,
    commit: str,
    explanation: str | None = None,
) -> dict[str, Any]:
    """A row of ``pfllib_crosscheck.json`` (keys `ROW_KEYS`, plus ``explanation`` when explained)."""
    kind, reason = verdict(diff, explanation)
    row = dict(
        method=method,
        partition=partition,
        mode='exact',
        rounds=int(rounds),
        max_abs_weight_diff=float(diff),
        accuracy_fedpersonal=round(float(accuracy_fedpersonal), 6),
        accuracy_pfllib=round(float(accuracy_pfllib), 6),
        verdict=kind,
        pfllib_commit=commit,
    )
    if reason:
        row['explanation'] = reason
    return row


def merge_rows(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`old` with rows of the same (method, partition, mode) as a `new` one replaced, in a stable order."""
    key = lambda r: (r['method'], r['partition'], r['mode'])
    merged = {key(r): r for r in old}
    merged.update({key(r): r for r in new})
    return [merged[k] for k in sorted(merged)]


def full_weights(global_weights: Sequence[np.ndarray], local_weights: Sequence[np.ndarray], local_layers) -> list:
    """A client's whole model (`LAYERS` order, kernel then bias) from the global and the local layers' weights,
    then the weights of a method's own local layers, which the CNN lacks (FedDBE's representation bias)."""
    glob, loc, out = list(global_weights), list(local_weights), []
    for layer in LAYERS:
        source = loc if local_layers == 'all' or layer in local_layers else glob
        out += [source.pop(0), source.pop(0)]
    own_layers = local_layers != 'all' and any(layer not in LAYERS for layer in local_layers)
    if glob or (loc and not own_layers):
        raise ValueError(f'{len(glob)} global and {len(loc)} local weights left over')
    return out + loc


STATISTICAL_ONE_SEED_TOLERANCE = 0.01  # One seed per side: final accuracies within 1 percentage point.


def statistical_verdict(
    finals_fedpersonal: Sequence[float], finals_pfllib: Sequence[float], explanation: str | None
) -> tuple[str, str | None, float, str]:
    """Statistical mode's verdict on the final accuracies of each side's seeds: ``equal`` when the means differ by
    no more than the spread over seeds (the larger of the two sides' ranges, max - min), or, unless both sides ran
    at least two seeds, by no more than `STATISTICAL_ONE_SEED_TOLERANCE` (a one-seed rule: it says nothing of the
    spread); else ``explained`` with `explanation` or ``unexplained``. Returns the verdict, the explanation, the
    bound used and the rule's name. A NaN accuracy is never equal."""
    ours, theirs = np.asarray(finals_fedpersonal, np.float64), np.asarray(finals_pfllib, np.float64)
    if not ours.size or not theirs.size:
        raise ValueError('a side has no seed')
    if ours.size >= 2 and theirs.size >= 2:
        bound, rule = float(max(np.ptp(ours), np.ptp(theirs))), 'seed spread'
    else:
        bound, rule = STATISTICAL_ONE_SEED_TOLERANCE, 'one-seed rule (1 point)'
    gap = abs(float(ours.mean()) - float(theirs.mean()))
    if gap <= bound + 1e-12:  # False for NaN.
        return 'equal', None, bound, rule
    return ('explained', explanation, bound, rule) if explanation else ('unexplained', None, bound, rule)


def mean_curve(curves: Sequence[Sequence[float]]) -> list[float]:
    """The mean over seeds of equally long per-round accuracy curves (raises on unequal lengths)."""
    if len({len(c) for c in curves}) != 1:
        raise ValueError(f'curves of lengths {[len(c) for c in curves]}')
    return [float(x) for x in np.mean(np.asarray(curves, np.float64), axis=0)]


def config_fields(args_of: Any, config: Any) -> dict[str, Any]:
    """The config fields `args_of` (a method's `PfllibMethod.args`) reads, with their values: the method's own
    hyperparameters on fedpersonal's side, under fedpersonal's names."""
    read: dict[str, Any] = {}

    class Recorder:
        def __getattr__(self, name):
            read[name] = getattr(config, name)
            return read[name]

    args_of(Recorder())
    return read


def method_options(method: str, config: Any) -> dict[str, Any]:
    """Every option flag of the algorithm module that declares row `method` (`fedpersonal.registry`), with
    `config`'s values: what fedpersonal ran with, also the options PFLlib has no argument for (``apfl_variant``)."""
    from fedpersonal import registry  # pylint: disable=g-import-not-at-top

    for declaration in registry.declarations():
        if any(name == method for name, _, _ in declaration.rows):
            return {declaration.flag(f.name): getattr(config, declaration.flag(f.name)) for f in declaration.fields()}
    raise ValueError(f'no algorithm module declares a row {method!r}')


def make_statistical_row(
    method: str,
    partition: str,
    rounds: int,
    curves_fedpersonal: dict[int, Sequence[float]],
    curves_pfllib: dict[int, Sequence[float]],
    hyperparameters_fedpersonal: dict[str, Any],
    hyperparameters_pfllib: dict[str, Any],
    commit: str,
    explanation: str | None = None,
    seconds_per_round: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A statistical-mode row: `ROW_KEYS` (``max_abs_weight_diff`` None: the two sides share no weight trajectory;
    the accuracies the final ones of the mean curves over seeds), ``explanation`` when explained, then the mean
    curves (``curve_fedpersonal``, ``curve_pfllib``: the accuracy after rounds 1..rounds), each seed's curve, the
    largest gap of the mean curves, the rule of the verdict and its bound, and each side's hyperparameters."""
    for side, curves in (('fedpersonal', curves_fedpersonal), ('pfllib', curves_pfllib)):
        if any(len(c) != rounds for c in curves.values()):
            raise ValueError(f'{side}: a curve is not {rounds} rounds long')
    ours, theirs = mean_curve(list(curves_fedpersonal.values())), mean_curve(list(curves_pfllib.values()))
    kind, reason, bound, rule = statistical_verdict(
        [c[-1] for c in curves_fedpersonal.values()], [c[-1] for c in curves_pfllib.values()], explanation
    )
    rnd = lambda xs: [round(float(x), 6) for x in xs]
    row = dict(
        method=method,
        partition=partition,
        mode='statistical',
        rounds=int(rounds),
        max_abs_weight_diff=None,
        accuracy_fedpersonal=round(ours[-1], 6),
        accuracy_pfllib=round(theirs[-1], 6),
        verdict=kind,
        pfllib_commit=commit,
    )
    if reason:
        row['explanation'] = reason
    row.update(
        curve_fedpersonal=rnd(ours),
        curve_pfllib=rnd(theirs),
        max_curve_gap=round(max(abs(a - b) for a, b in zip(ours, theirs)), 6),
        seeds_fedpersonal=sorted(int(k) for k in curves_fedpersonal),
        seeds_pfllib=sorted(int(k) for k in curves_pfllib),
        curves_by_seed_fedpersonal={str(k): rnd(c) for k, c in sorted(curves_fedpersonal.items())},
        curves_by_seed_pfllib={str(k): rnd(c) for k, c in sorted(curves_pfllib.items())},
        verdict_rule=rule,
        verdict_bound=round(bound, 6),
        hyperparameters_fedpersonal=dict(hyperparameters_fedpersonal),
        hyperparameters_pfllib=dict(hyperparameters_pfllib),
    )
    if seconds_per_round:
        row['seconds_per_round'] = {k: round(float(v), 1) for k, v in seconds_per_round.items()}
    return row


def exact_train_rows(rows: int, limit: int, batch_size: int) -> int:
    """A client's rows in exact mode: at most `limit`, a multiple of two batches (no batch dropped on either side;
    Per-FedAvg's double batches full)."""
    return min(rows, limit) // (2 * batch_size) * (2 * batch_size)


# ----------------------------------------------------------------------------------------- fedpersonal side
def parse_overrides(items: Sequence[str], config: Any) -> dict[str, Any]:
    """``['fedprox_mu=1.0', ...]`` as config values, each of its field's current type."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition('=')
        if not sep or not hasattr(config, name):
            raise ValueError(f'an override is name=value of a config field, got {item!r}')
        out[name] = type(getattr(config, name))(value)
    return out


def run_fedpersonal(
    method: str,
    partition: str,
    clients: int | None,
    train_rows: int | None,
    rounds: int,
    data_dir: str | None,
    overrides: Sequence[str] = (),
    seed: int = 0,
    every_round: bool = False,
    on_ready: Any = None,
):
    """Trains `method` on the reduced partition (`clients` None: all clients, all their train rows; statistical
    mode); returns the config, the clients' arrays in training order, the initial and final weights (Keras layout)
    and the accuracies. `every_round`: the benchmark's evaluation after every round (``curve``, statistical mode),
    the last one the final accuracy; training and evaluation seconds of each round in ``round_seconds`` and
    ``eval_seconds``. `on_ready`, if given, is called before the first round with the config, the initial weights,
    the pooled arrays and the partition's rows (e.g. to start PFLlib's side beside this one)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    from fedpersonal.core import client_plan  # pylint: disable=g-import-not-at-top
    from fedpersonal.data import pfllib  # pylint: disable=g-import-not-at-top
    from fedpersonal.models import image_classifiers  # pylint: disable=g-import-not-at-top
    from fedpersonal.tasks import pfl_benchmark  # pylint: disable=g-import-not-at-top
    from fedpersonal.tasks import pfl_benchmark_evaluation as evaluation  # pylint: disable=g-import-not-at-top
    from fedpersonal.tasks.pfl_benchmark_config import PflBenchmarkConfig  # pylint: disable=g-import-not-at-top
    from fedpersonal.tasks.pfl_benchmark_methods import METHOD_SPECS  # pylint: disable=g-import-not-at-top

    config = PflBenchmarkConfig(
        partition=partition, configurations=(method,), seeds=(seed,), data_dir=data_dir, state_store='memory'
    )
    config = dataclasses.replace(config, seed=seed, **parse_overrides(overrides, config))
    if clients is not None:  # Exact mode: PFLlib's side reads the rows in the order they are written, every epoch.
        config = dataclasses.replace(config, epoch_order='fixed')
    tf.random.set_seed(config.seed)
    full = pfl_benchmark.load_data(config)
    part = full.partition
    if clients is None:  # Statistical mode: every client, every train row.
        keep = [r.size for r in part.train]
        data = full
    else:
        keep = [exact_train_rows(r.size, train_rows, config.batch_size) for r in part.train[:clients]]
        if min(keep) < 2 * config.batch_size:
            raise ValueError(
                f'a client of the first {clients} has fewer than {2 * config.batch_size} train rows: {keep}'
            )
        reduced = pfllib.PfllibPartition(
            [r[:k] for r, k in zip(part.train, keep)],
            list(part.test[:clients]),
            part.label_counts[:clients],
            part.settings,
        )
        data = pfllib.PfllibImageData(full.name, full.x, full.y, reduced, full.num_classes)
        config = dataclasses.replace(config, num_clients=clients)
    benchmark = evaluation.Benchmark(config, data)
    spec = METHOD_SPECS[method]
    initial = image_classifiers.fedavg_cnn(data.x.shape[1:], data.num_classes, seed=config.seed).get_weights()
    plan, phased_model = pfl_benchmark.method_parts(benchmark, method)
    process = pfl_benchmark.build_method_process(benchmark, method, plan, phased_model)
    ids = benchmark.client_ids
    state = process.initialize()
    if plan.table is not None:  # FedAMP: no global model (the server keeps rows); each client starts from its own.
        start = [np.asarray(w) for w in process.initial_private_state().trainable]
        global_layers, shared = [], initial
    else:
        start = [np.asarray(w) for w in client_plan.model_weights(plan, process.get_model_weights(state)).trainable]
        global_layers = LAYERS if phased_model is not None else [x for x in LAYERS if x not in spec.local_layers]
        shared = [w for layer, i in zip(LAYERS, range(0, 8, 2)) if layer in global_layers for w in initial[i : i + 2]]
    if max_abs_diff(start, shared) != 0.0:  # The exported weights are the ones fedpersonal starts from.
        raise AssertionError('the process does not start from fedavg_cnn(seed) weights')
    private = [process.initial_private_state() for _ in ids] if plan.stateful else None
    if on_ready is not None:
        on_ready(
            dict(
                config=config,
                initial=initial,
                pooled=(data.x, data.y),
                partition_rows=(part.train, part.test),
                full_partition=(full.y, part.train, part.test),
            )
        )
    per_client: dict[str, Any] = {}
    original = evaluation._accuracies  # pylint: disable=protected-access

    def capture(result):
        per_client['accuracy'] = np.asarray(result['per_client']['accuracy'], np.float64).tolist()
        return original(result)

    evaluation._accuracies = capture  # pylint: disable=protected-access
    curve, round_seconds, eval_seconds = [], [], []
    try:
        evaluate = pfl_benchmark.method_evaluation(benchmark, method, plan, phased_model)
        started = time.time()
        for round_num in range(1, rounds + 1):
            tick = time.time()
            if config.epoch_order == 'reshuffled':  # A new order every round, packed afresh (no ids, no cache).
                datasets = [benchmark.round_train_dataset(c, round_num) for c in ids]
                out = process.run_round(state, datasets, private)
            else:
                datasets = [benchmark.train_dataset(benchmark.train[c]) for c in ids]
                out = process.run_round(state, datasets, private, client_ids=ids)
            state = out.state
            if plan.stateful:
                private = list(out.private_states)
            round_seconds.append(time.time() - tick)
            if every_round:
                tick = time.time()
                weights = process.get_model_weights(state)
                metrics = evaluate(weights, private) if plan.stateful else evaluate(weights)
                curve.append(float(metrics['accuracy']))
                eval_seconds.append(time.time() - tick)
                print(f'  fedpersonal {method} seed {seed} round {len(curve)}: {curve[-1]:.4f}', flush=True)
        seconds = time.time() - started
        weights = process.get_model_weights(state)
        if not every_round:
            metrics = evaluate(weights, private) if plan.stateful else evaluate(weights)
    finally:
        evaluation._accuracies = original  # pylint: disable=protected-access
    # The model's (SCAFFOLD's server holds c after them); `personalized_weights` reads the server's weights.
    global_trainable = [np.asarray(w) for w in client_plan.model_weights(plan, weights).trainable]
    clients_weights, trained_local = [], []
    for p in private or [None] * len(ids):
        if p is not None and plan.global_start is not None:  # FedALA: v, the trained local model (then W).
            trained_local.append([np.asarray(w) for w in list(p.trainable)[: len(global_trainable)]])
        if p is None:
            clients_weights.append(global_trainable)
            continue
        own = client_plan.personalized_weights(plan, weights, p)
        if phased_model is not None:  # FedRoD: the whole global model, then the personal head.
            clients_weights.append(global_trainable + [np.asarray(w) for w in own.trainable])
        elif plan.personal or plan.personalization is not None or plan.global_start is not None:
            clients_weights.append([np.asarray(w) for w in own.trainable])
        else:
            clients_weights.append(full_weights(global_trainable, own.trainable, spec.local_layers))
    ala_starts = None
    if plan.global_start is not None:  # FedALA: the start of W's slice at each client's k-th aggregation.
        from fedpersonal.algorithms import fedala  # pylint: disable=g-import-not-at-top

        ala_starts = [
            [int(fedala.slice_bounds(plan.global_start, tf.constant(n, tf.int64), k)[0]) for k in range(rounds + 1)]
            for n in keep
        ]
    xs = [data.x[rows] for rows in benchmark.train_rows]
    ys = [data.y[rows] for rows in benchmark.train_rows]
    test_rows = data.partition.test
    return dict(
        config=config,
        initial=initial,
        train=(xs, ys),
        test=([data.x[r] for r in test_rows], [data.y[r] for r in test_rows]),
        global_weights=global_trainable,
        global_layers=list(global_layers),  # FedRoD: the whole model (its generic head) is global; FedAMP: none.
        clients=clients_weights,
        accuracy=float(metrics['accuracy']),
        client_accuracy=per_client.get('accuracy'),
        train_rows=keep,
        full_partition=(full.y, part.train, part.test),
        ala_starts=ala_starts,
        trained_local=trained_local,
        seconds=seconds,
        curve=curve,
        round_seconds=round_seconds,
        eval_seconds=eval_seconds,
        pooled=(data.x, data.y),  # Statistical mode: PFLlib's clients are written in its partition's order.
        partition_rows=(part.train, part.test),
    )
