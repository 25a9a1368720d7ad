"""The classic personalization family on PFLlib's benchmark: label-skewed Fashion-MNIST over 20 clients.

The data is PFLlib's (`fedpersonal.data.pfllib`: its pathological or Dirichlet partition and 75/25 per-client split,
drawn as PFLlib draws them), the model its 4-layer CNN (`fedpersonal.models.image_classifiers.fedavg_cnn`), every
client trains every round with SGD (batch 10, learning rate 0.005, 1 local epoch) and the server averages by
examples. Every method is a `fedpersonal.core.client_plan.ClientPlan` from its algorithm module, run on the
configured backend (`fedpersonal.backends`); a method here is only its plan and which layers stay on the clients
(`fedpersonal.tasks.pfl_benchmark_methods`, the rows), evaluated as PFLlib evaluates
(`fedpersonal.tasks.pfl_benchmark_evaluation`).

Seeds: every method runs once per seed of `seeds` (``<output_dir>/<method>/seed<k>/``); a seed sets the model's
initial weights and the order of each client's train examples (a permutation of its partition rows, drawn from the
seed; the partition itself is `partition_seed`'s). A row is the mean and standard deviation over the seeds
(`fedpersonal.tasks.pfl_benchmark_results`). A run killed at any point resumes from its checkpoints; a finished one
(its ``results.json``) is read back on a rerun, which may add methods or seeds.

Evaluation is PFLlib's: each client's test data with the model it predicts with (the global model, or its personal
one: `client_plan.personalized_weights`), accuracy = correct test predictions over all test examples, plus the mean
and the worst client's accuracy. Every `rounds_per_eval` rounds and after the last; a row reports the accuracy at
the last round, the best one so far (PFLlib's leaderboard number is that best, taken on test) and the slope of
the last 10% of rounds.

A client's train rows come in a new order every round (``epoch_order='reshuffled'``, drawn from the seed and the
round, `Benchmark.round_train_dataset`; PFLlib's DataLoader draws one every epoch, which differs with
``client_epochs`` > 1) or in the seed's order every round (``'fixed'``). As PFLlib, a last partial train batch is
dropped: the dropped rows are counted, logged once and recorded in every row of results.json (``dropped_train_rows`` of ``train_rows``,
``clients_with_dropped_rows``). Unlike PFLlib, a partition leaving a client fewer train rows than a batch (it would
never train, yet be scored) is refused, naming the clients (`pfllib.TooFewTrainRowsError`): the same rule as for a
client without train rows.

Your own images and model: ``dataset='npz'`` reads ``data_path`` (`fedpersonal.data.npz_images`: arrays ``x`` and
``y``, checked up front), pooled and partitioned as the leaderboard datasets are, the results labelled by the file's
stem; ``model='module:function'`` is a Keras model factory (`fedpersonal.models.keras_factory`) in place of PFLlib's
CNN, its last layer the head of the methods that keep one on the clients. `check_model` checks both before the first
run: PFLlib's CNN needs images of at least 16 x 16 (smaller ones need ``model``, e.g.
``fedpersonal.models.image_classifiers:small_cnn``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import backends
from fedpersonal import client_state
from fedpersonal import errors
from fedpersonal import program
from fedpersonal import progress
from fedpersonal.core import input_checks
from fedpersonal.data import federated_images
from fedpersonal.data import npz_images
from fedpersonal.data import pfllib
from fedpersonal.models import image_classifiers
from fedpersonal.models import keras_factory
from fedpersonal.program import run_record
from fedpersonal.program import training_loop
from fedpersonal.runtime import engine_workers
from fedpersonal.tasks import pfl_benchmark_movielens
from fedpersonal.tasks import pfl_benchmark_results
from fedpersonal.tasks.pfl_benchmark_config import METHOD_NAMES
from fedpersonal.tasks.pfl_benchmark_config import METHODS as METHODS
from fedpersonal.tasks.pfl_benchmark_config import MOVIELENS_DATASETS
from fedpersonal.tasks.pfl_benchmark_config import NPZ
from fedpersonal.tasks.pfl_benchmark_config import PflBenchmarkConfig as PflBenchmarkConfig
from fedpersonal.tasks.pfl_benchmark_evaluation import Benchmark
from fedpersonal.tasks.pfl_benchmark_evaluation import make_evaluation
from fedpersonal.tasks.pfl_benchmark_methods import METHOD_SPECS
from fedpersonal.tasks.pfl_benchmark_methods import element_spec
from fedpersonal.tasks.pfl_benchmark_methods import loss_fn
from fedpersonal.tasks.pfl_benchmark_methods import metrics_fn
from fedpersonal.tasks.pfl_benchmark_methods import model_fn_for
from fedpersonal.tasks.pfl_benchmark_results import summarize as summarize


def load_data(config: PflBenchmarkConfig) -> pfllib.PfllibImageData:
    """The pooled images and their PFLlib partition."""
    if config.dataset == 'synthetic':
        half = config.synthetic_examples // 2
        source = federated_images.load_source(
            'generated', None, generated_train=half, generated_test=config.synthetic_examples - half, seed=0
        )
    elif config.dataset == NPZ:
        assert config.data_path is not None  # PflBenchmarkConfig requires it.
        source = npz_images.load_npz(config.data_path)
        needed = config.num_clients * math.ceil(config.batch_size / config.train_ratio)
        rows = len(source.train_labels)
        if rows < needed:
            raise errors.DataError(
                f'--data_path={config.data_path}: {rows} images for {config.num_clients} clients, each needing at '
                f'least {math.ceil(config.batch_size / config.train_ratio)} (one train batch of {config.batch_size} '
                f'at train_ratio {config.train_ratio:g}): give at least {needed} images, fewer --num_clients or a '
                'smaller --batch_size.'
            )
    else:
        source = federated_images.load_source(config.dataset, config.data_dir, tfds_data_dir=config.tfds_data_dir)
    try:
        return _federate(config, source)
    except pfllib.TooFewTrainRowsError:
        raise
    except errors.InputError as error:  # The partition of a user's file: name it.
        if config.dataset != NPZ:
            raise
        raise type(error)(
            f'--data_path={config.data_path} ({len(source.train_labels)} images, {source.num_classes} classes) '
            f'cannot be partitioned by --partition={config.partition}: {error}'
        ) from None


def _federate(config: PflBenchmarkConfig, source: Any) -> pfllib.PfllibImageData:
    return pfllib.federate(
        source,
        config.partition,
        num_clients=config.num_clients,
        class_per_client=config.class_per_client,
        alpha=config.dirichlet_alpha,
        batch_size=config.batch_size,
        train_ratio=config.train_ratio,
        seed=config.partition_seed,
        min_train_rows=config.batch_size,  # A client with less never trains (its partial batch is dropped).
    )


def needs_head(name: str) -> bool:
    """Whether method `name` splits the model into a body and a head (its last layer)."""
    spec = METHOD_SPECS[name]
    return bool(spec.local_layers) or spec.phased_model is not None


def check_model(config: PflBenchmarkConfig, data: pfllib.PfllibImageData) -> str:
    """Checks up front that the configured model takes `data`'s images and gives its classes' logits, with the head
    the configured methods need; returns the model's label for the results (``model`` or ``'pfllib_cnn'``).

    Raises:
      errors.ConfigError: PFLlib's CNN (no ``--model``) on images under 16 x 16, or a ``--model`` that fails
        `keras_factory.build` or, for a method with a head, `keras_factory.head_layer`.
    """
    shape = tuple(int(d) for d in data.x.shape[1:])
    if config.model is None:
        if not image_classifiers.fits_fedavg_cnn(shape):
            source = f'--data_path={config.data_path}' if config.dataset == NPZ else f'--dataset={config.dataset}'
            raise errors.ConfigError(
                f"{source}: images of {shape[0]} x {shape[1]}; PFLlib's CNN (the default model) needs at least 16 x "
                '16. Pass --model=fedpersonal.models.image_classifiers:small_cnn (a small CNN for any size) or your '
                'own factory, --model=mypackage.models:my_model.'
            )
        return 'pfllib_cnn'
    model = keras_factory.build(config.model, shape, data.num_classes, seed=config.seed)
    for name in config.configurations:
        if needs_head(name):
            keras_factory.head_layer(model, name, config.model)
    return config.model


def method_parts(benchmark: Benchmark, name: str) -> tuple[Any, Any]:
    """Method `name`'s client plan and, for a plan with model-defined losses, its model (else None)."""
    config, spec = benchmark.config, METHOD_SPECS[name]
    phased_model = (
        spec.phased_model(benchmark.data, config.seed, config.model) if spec.phased_model is not None else None
    )
    return spec.plan(config), phased_model


def build_method_process(benchmark: Benchmark, name: str, plan: Any, phased_model: Any) -> Any:
    """Method `name`'s process on `benchmark`'s data (its config's simulation backend and strategy), from its
    `method_parts`."""
    config, spec = benchmark.config, METHOD_SPECS[name]
    common_parts: dict[str, Any] = dict(
        server_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
        group_size=config.group_size,
        name=METHOD_NAMES[name],
    )
    with backends.use(config.simulation, strategy=config.engine_strategy):
        if phased_model is not None:  # Its loss and metrics are the model's.
            return backends.build_process(plan, phased_model, element_spec=element_spec(benchmark.data), **common_parts)
        process = backends.build_process(
            plan,
            # A personal copy is of a model whose weights are all global; its evaluation model has them all local.
            model_fn_for(
                benchmark.data,
                config.seed,
                () if plan.personal else spec.local_layers,
                config.model,
                spec.keras_transform,
            ),
            loss_fn=loss_fn,
            metrics_fn=metrics_fn,
            client_weighting=spec.client_weighting,
            **common_parts,
        )
    input_checks.check_num_classes(process, benchmark.data.num_classes, source=f'{benchmark.data.name} data')
    return process


def worker_setup(config: PflBenchmarkConfig, name: str) -> engine_workers.WorkerSetup:
    """What an engine worker (``--engine_workers``) builds for method `name`: the same partition (read where the
    worker runs), process and clients' training datasets by id as `run_method`'s."""
    tf.random.set_seed(config.seed)
    benchmark = Benchmark(config, load_data(config))
    process = build_method_process(benchmark, name, *method_parts(benchmark, name))
    return engine_workers.WorkerSetup(process, lambda cid: benchmark.train_dataset(benchmark.train[cid]))


def method_evaluation(benchmark: Benchmark, name: str, plan: Any, phased_model: Any) -> Callable[..., dict[str, float]]:
    """Method `name`'s evaluation (`make_evaluation` with its `Method`'s layers and settings), from its
    `method_parts`."""
    spec = METHOD_SPECS[name]
    return make_evaluation(
        benchmark,
        plan,
        spec.local_layers,
        finetune=spec.finetune,
        adapts=spec.adapts,
        phased_model=phased_model,
        transform=spec.keras_transform,
    )


def check_epoch_order(config: PflBenchmarkConfig) -> None:
    """Raises errors.ConfigError for engine workers (`engine_workers.request`) with a new order every round: each
    worker loads a client's data by id, the same every round."""
    if config.epoch_order == 'reshuffled' and engine_workers.request() is not None:
        raise errors.ConfigError(
            "--engine_workers: the workers load each client's data by id, the same every round; "
            '--epoch_order=reshuffled draws a new order every round. Pass --epoch_order=fixed.'
        )


def run_method(benchmark: Benchmark, outputs: program.ExperimentOutputs, name: str) -> dict[str, Any]:
    """Trains one method on every client every round; its row (accuracy at the last round, best, slope, clients)."""
    config = benchmark.config
    plan, phased_model = method_parts(benchmark, name)
    process = build_method_process(benchmark, name, plan, phased_model)
    evaluate = method_evaluation(benchmark, name, plan, phased_model)
    common: dict[str, Any] = dict(
        outputs=outputs,
        client_data=benchmark.train,
        evaluation_name='test',
        name=f'{name} seed {config.seed}',
    )
    if config.epoch_order == 'reshuffled':  # A new order of each client's rows every round.
        check_epoch_order(config)
        common['round_dataset_fn'] = lambda client_id, _, round_num: benchmark.round_train_dataset(client_id, round_num)
    else:
        common['dataset_fn'] = benchmark.train_dataset
    # With --engine_workers, every worker builds this process and reads its clients itself (the same recipe).
    with engine_workers.serve(functools.partial(worker_setup, config, name), process, METHOD_NAMES[name]):
        if not plan.stateful:  # FedRecon: nothing kept on the clients.
            program.run_process(process, config, evaluation_fn=evaluate, **common)
            return summarize(outputs.read_metrics(), seconds_per_round=outputs.median_round_seconds())
        initial = training_loop.from_model_weights(process.initial_private_state())
        store = program.open_store(
            config.state_store, outputs, client_state.spec_of(initial), lambda client_id: [a.copy() for a in initial]
        )
        with store:
            program.run_process(process, config, client_evaluation_fn=evaluate, client_state_store=store, **common)
    return summarize(outputs.read_metrics(), seconds_per_round=outputs.median_round_seconds())


def _run_path(name: str, seed: int, rate: float | None = None) -> str:
    """The directory of one method's run with one seed (and a client learning rate of a selection)."""
    return os.path.join(name, f'seed{seed}') if rate is None else os.path.join(name, f'lr{rate:g}', f'seed{seed}')


def _finished(config: PflBenchmarkConfig, name: str, seed: int, rate: float | None = None) -> dict[str, Any] | None:
    """The row of a run that finished earlier (its ``results.json``, written last), else None."""
    path = os.path.join(config.output_dir, _run_path(name, seed, rate), 'results.json')
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


Run = tuple[str, int, float | None]  # (method, seed, client learning rate of a selection; None: the config's).


def _schedule(config: PflBenchmarkConfig, runs: dict[Run, Any], chosen: dict[str, float], metric: str):
    """The runs in order: every method with every seed; with ``client_learning_rates``, first the first seed with
    each rate, the rate of the best validation `metric` (recorded in `chosen`, read from `runs` as they finish),
    then the other seeds with it."""
    rates, (first, *others) = config.client_learning_rates, config.seeds
    sign = 1.0 if pfl_benchmark_results.METRICS[metric] else -1.0
    for name in config.configurations:
        if not rates:
            yield from ((name, seed, None) for seed in config.seeds)
            continue
        yield from ((name, first, rate) for rate in rates)

        def score(rate: float) -> float:  # A diverged run (None: not finite in JSON) is never chosen.
            value = runs[(name, first, rate)].get(f'validation_{metric}')
            return sign * value if value is not None and math.isfinite(value) else -math.inf

        if all(score(rate) == -math.inf for rate in rates):
            raise errors.InputError(
                f'{name}: training diverged with every client learning rate of --client_learning_rates={list(rates)} '
                f'(first seed {first}; see {os.path.join(config.output_dir, name)}); give smaller ones.'
            )
        chosen[name] = max(rates, key=score)
        logging.info('[%s] client learning rate %g selected on validation among %s', name, chosen[name], rates)
        yield from ((name, seed, chosen[name]) for seed in others)


def run(config: PflBenchmarkConfig) -> dict[str, Any]:
    """Runs every configured method with every seed on the partition (runs that finished earlier are read back);
    writes each run's row, results.json (the rows over seeds) and accuracy_by_round.png. MovieLens
    (`MOVIELENS_DATASETS`): the rating block of `fedpersonal.tasks.pfl_benchmark_movielens`, rows by RMSE, each
    method's client learning rate selected on validation among ``client_learning_rates`` (if given)."""
    run_record.check_output_dir(config)
    program.write_json(os.path.join(config.output_dir, 'config.json'), dataclasses.asdict(config))
    data: Any
    make_benchmark: Callable[..., Any]
    run_one: Callable[..., dict[str, Any]]
    model = None  # The image model's label (the rating block's is its own).
    if config.dataset in MOVIELENS_DATASETS:
        if engine_workers.request() is not None:
            raise errors.ConfigError(
                f'--engine_workers: the {config.dataset} rating block runs in this process only (the image '
                'datasets run on engine workers).'
            )
        data = pfl_benchmark_movielens.load_data(config)
        partition, metric = data.partition, pfl_benchmark_movielens.METRIC
        make_benchmark, run_one = pfl_benchmark_movielens.MovieLensBenchmark, pfl_benchmark_movielens.run_method
    else:
        check_epoch_order(config)
        data = load_data(config)
        partition, metric, make_benchmark, run_one = config.partition, 'accuracy', Benchmark, run_method
        model = check_model(config, data)
    statistics = data.statistics()
    logging.info(
        '%s partition of %s: %s',
        partition,
        data.name,
        {k: v for k, v in statistics.items() if k != 'label_counts'},
    )
    dropped: dict[str, int] = {}  # The rows of partial train batches (image block), in every row.
    if config.dataset not in MOVIELENS_DATASETS:
        dropped = pfllib.partial_batches([r.size for r in data.partition.train], config.batch_size)
        logging.info(
            '%d of %d train rows (%.1f%%) of %d of %d clients are in a last partial batch of %d, dropped (as PFLlib '
            'drop_last) %s; every row of results.json records them',
            dropped['dropped_train_rows'],
            dropped['train_rows'],
            100.0 * dropped['dropped_train_rows'] / max(dropped['train_rows'], 1),
            dropped['clients_with_dropped_rows'],
            len(data.client_ids),
            config.batch_size,
            'rows of a new order every round' if config.epoch_order == 'reshuffled' else 'and never trained on',
        )
    runs: dict[Run, dict[str, Any]] = {}
    chosen: dict[str, float] = {}
    rates = config.client_learning_rates
    total = len(config.configurations) * (len(rates) + len(config.seeds) - 1 if rates else len(config.seeds))
    benchmarks: dict[tuple[int, float | None], Any] = {}
    description = '[pfl_benchmark] runs (method x seed' + (' x learning rate)' if rates else ')')
    for name, seed, rate in progress.logged(
        _schedule(config, runs, chosen, metric), total, description, delay=0.0, interval=1.0
    ):
        finished = _finished(config, name, seed, rate)
        if finished is not None:
            logging.info(
                '[%s seed %d%s] finished earlier: its row is read back',
                name,
                seed,
                '' if rate is None else f' lr {rate:g}',
            )
            runs[(name, seed, rate)] = finished
            continue
        if (seed, rate) not in benchmarks:
            run_config = dataclasses.replace(config, seed=seed)
            if rate is not None:
                run_config = dataclasses.replace(run_config, client_learning_rate=rate)
            benchmarks[(seed, rate)] = make_benchmark(run_config, data)
        tf.random.set_seed(seed)  # Op-level seeds combine with the same graph-level seed whatever ran before.
        outputs = program.ExperimentOutputs(config.output_dir, _run_path(name, seed, rate))
        started = time.time()
        row = {'name': METHOD_NAMES[name], 'method': name, 'seed': seed, **dropped}
        try:
            row.update(run_one(benchmarks[(seed, rate)], outputs, name))
        except program.NonFiniteLossError as error:
            if rate is None or seed != config.seeds[0]:  # Not a candidate of a selection: the run fails.
                raise
            logging.warning('[%s lr %g] diverged, not a candidate: %s', name, rate, error)
            row.update({'diverged': str(error), 'client_learning_rate': rate})
            outputs.write_json('results.json', row)
            runs[(name, seed, rate)] = row
            continue
        outputs.write_json('results.json', row)  # Written last: the run is finished.
        runs[(name, seed, rate)] = row
        logging.info(
            '[%s seed %d%s] %s %.4f (%s %.4f) in %.0fs',
            name,
            seed,
            '' if rate is None else f' lr {rate:g}',
            metric,
            row[metric],
            f'validation {metric}' if f'validation_{metric}' in row else 'best',
            row.get(f'validation_{metric}', row.get(f'best_{metric}')),
            time.time() - started,
        )
    rows = []
    for name in config.configurations:
        row = pfl_benchmark_results.over_seeds(
            [runs[(name, seed, chosen.get(name))] for seed in config.seeds], config.seeds, metric
        )
        row.update(dropped)  # Counts, not means (a run read back from before they were recorded lacks them).
        if rates:
            first = config.seeds[0]
            row['client_learning_rate'] = chosen[name]
            row['learning_rate_selection'] = {
                f'{r:g}': runs[(name, first, r)].get(f'validation_{metric}') for r in rates
            }
        rows.append(row)
    results: dict[str, Any] = {
        'dataset': data.name,
        'partition': partition,
        'clients': len(data.client_ids),
        'metric': metric,
        'seeds': list(config.seeds),
        'statistics': statistics,
        'rows': rows,
    }
    if config.dataset in MOVIELENS_DATASETS:
        results['curve_split'] = 'validation'
    else:
        results['model'] = model
    figure = pfl_benchmark_results.plot_by_round(results, os.path.join(config.output_dir, f'{metric}_by_round.png'))
    results['figures'] = {f'{metric}_by_round': figure}
    program.write_json(os.path.join(config.output_dir, 'results.json'), results)
    return results
