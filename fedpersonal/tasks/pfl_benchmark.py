"""The classic personalization family on PFLlib's benchmark: label-skewed Fashion-MNIST over 20 clients.

The data is PFLlib's (`fedpersonal.data.pfllib`: its pathological or Dirichlet partition and 75/25 per-client split,
drawn as PFLlib draws them), the model its 4-layer CNN (`fedpersonal.models.image_classifiers.fedavg_cnn`), every
client trains every round with SGD (batch 10, learning rate 0.005, 1 local epoch) and the server averages by
examples. Every method is a `fedpersonal.core.client_plan.ClientPlan` from its algorithm module, run on the
configured backend (`fedpersonal.backends`); a method here is only its plan and which layers stay on the clients:

* ``fedavg`` / ``fedprox``: the global model (FedProx's proximal term, `fedpersonal.algorithms.fedprox`);
* ``ditto`` / ``apfl``: a personal copy of the model per client (APFL: mixed with the global one by alpha);
* ``fedper`` / ``fedrep``: the head (``fc``) local; ``lg_fedavg``: the body (``conv1``, ``conv2``, ``fc1``) local;
* ``fedavg_ft`` / ``fedbabu``: FedAvg, and FedBABU (the head frozen at its initial values, only the body trained),
  each client fine-tuning its whole model on its train data for `finetune_epochs` epochs before every evaluation
  (`fedbabu.finetune_plan`; PFLlib fine-tunes once, after the last round);
* ``fed_recon``: the head reconstructed on each client's support data every round (stateless), evaluated by
  ReconEval on each client's test data (the head reconstructed on its support part, accuracy on its query part);
* ``furl_head``: a persistent private head with FURL's norm penalty (`furl_private_norm`).

FedBN (`fedpersonal.algorithms.fedbn`) is not a row: PFLlib's CNN has no batch normalization, on which FedBN is
FedAvg.
* ``per_fedavg`` (first-order, as PFLlib) / ``per_fedavg_hf`` (Hessian-free): the global model, meta-learned
  (`fedpersonal.algorithms.per_fedavg`); evaluated after one SGD step on the client's first train batch (PFLlib's
  ``evaluate_one_step``; PFLlib takes a random batch);
* ``pfedme``: the global model and each client's personalized theta, the model it is evaluated with
  (`fedpersonal.algorithms.pfedme`; PFLlib's pFedMeOptimizer weight decay mu = 0.001; server beta = 1).
* ``fedala``: each client's own model, the head (``layer_idx`` 2) aggregated element-wise with the global one at the
  start of its rounds (`fedpersonal.algorithms.fedala`); evaluated with that aggregation of its current weights W
  (PFLlib evaluates after one more epoch of W's learning);
* ``fedrod``: the body and a generic head (balanced softmax) global, a personal head local
  (`fedpersonal.algorithms.fedrod`); evaluated with the sum of both heads' logits.

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

Where this differs from PFLlib: a client's batches come in the same order every round (its train rows in the
seed's order; PFLlib reshuffles every epoch). As PFLlib, a last partial train batch is dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import backends
from fedpersonal import client_state
from fedpersonal import evaluation
from fedpersonal import models
from fedpersonal import program
from fedpersonal import progress
from fedpersonal.algorithms import apfl
from fedpersonal.algorithms import dataset_split
from fedpersonal.algorithms import ditto
from fedpersonal.algorithms import fed_recon
from fedpersonal.algorithms import fedala
from fedpersonal.algorithms import fedbabu
from fedpersonal.algorithms import fedper
from fedpersonal.algorithms import fedprox
from fedpersonal.algorithms import fedrep
from fedpersonal.algorithms import fedrod
from fedpersonal.algorithms import furl
from fedpersonal.algorithms import per_fedavg
from fedpersonal.algorithms import pfedme
from fedpersonal.core import client_plan
from fedpersonal.core import local_aggregation
from fedpersonal.data import client_data as client_data_lib
from fedpersonal.data import federated_images
from fedpersonal.data import pfllib
from fedpersonal.models import image_classifiers
from fedpersonal.program import run_record
from fedpersonal.program import training_loop
from fedpersonal.tasks import pfl_benchmark_movielens
from fedpersonal.tasks import pfl_benchmark_results
from fedpersonal.tasks.pfl_benchmark_config import METHOD_NAMES
from fedpersonal.tasks.pfl_benchmark_config import METHODS as METHODS
from fedpersonal.tasks.pfl_benchmark_config import MOVIELENS_DATASETS
from fedpersonal.tasks.pfl_benchmark_config import PflBenchmarkConfig as PflBenchmarkConfig
from fedpersonal.tasks.pfl_benchmark_results import summarize as summarize

EVAL_BATCH = 100
ModelWeights = tff.learning.models.ModelWeights


@dataclasses.dataclass(frozen=True)
class Method:
    """A benchmark row: its client plan (from the config) and the model's layers that stay on the clients."""

    plan: Callable[[PflBenchmarkConfig], client_plan.ClientPlan]
    local_layers: tuple[str, ...] = ()
    finetune: bool = False  # Each client fine-tunes its whole model on its train data before evaluation.
    adapts: bool = False  # Evaluated after one local step (`per_fedavg.adapt`).
    # A plan with model-defined losses (FedRoD): its model, from the data and the seed.
    phased_model: Callable[[pfllib.PfllibImageData, int], Callable[[], Any]] | None = None


def _sgd(config: PflBenchmarkConfig) -> tff.learning.optimizers.Optimizer:
    return tff.learning.optimizers.build_sgdm(learning_rate=config.client_learning_rate)


def _plain(config: PflBenchmarkConfig, mu: float) -> client_plan.ClientPlan:
    return fedprox.fedprox_plan(mu=mu, client_epochs=config.client_epochs, client_optimizer=_sgd(config))


RECON_SPLIT = dataset_split.ReconstructionSplit()  # FedRecon's support/query halves of a client's data.


def _per_fedavg(config: PflBenchmarkConfig, *, hessian_free: bool) -> client_plan.ClientPlan:
    return per_fedavg.per_fedavg_plan(
        batch_size=config.batch_size,
        inner_learning_rate=config.client_learning_rate,
        outer_optimizer=_sgd(config),  # PFLlib: beta = the learning rate.
        client_epochs=config.client_epochs,
        hessian_free=hessian_free,
    )


def _fedala(config: PflBenchmarkConfig) -> client_plan.ClientPlan:
    aggregation = local_aggregation.AdaptiveLocalAggregation(
        layer_idx=config.fedala_layer_idx,
        eta=config.fedala_eta,
        rand_percent=config.fedala_rand_percent,
        batch_size=config.batch_size,
        threshold=config.fedala_threshold,
        num_pre_loss=config.fedala_num_pre_loss,
        max_epochs=config.fedala_max_epochs,
        seed=config.seed,
    )
    return fedala.fedala_plan(
        client_epochs=config.client_epochs, client_optimizer=_sgd(config), aggregation=aggregation
    )


def fedrod_model_fn(data: pfllib.PfllibImageData, seed: int) -> Callable[[], fedrod.FedRodModel]:
    """FedRoD's model of the benchmark's CNN: its ``fc`` the generic head and, copied, the personal one."""
    height, width, channels = data.x.shape[1:]
    return lambda: fedrod.FedRodModel(
        image_classifiers.fedavg_cnn((height, width, channels), data.num_classes, seed=seed), data.num_classes
    )


METHOD_SPECS: dict[str, Method] = {
    'fedavg': Method(lambda c: _plain(c, 0.0)),
    'fedprox': Method(lambda c: _plain(c, c.fedprox_mu)),
    'ditto': Method(
        lambda c: ditto.ditto_plan(
            lam=c.ditto_lambda,
            client_epochs=c.client_epochs,
            personal_epochs=c.personal_epochs,
            client_optimizer=_sgd(c),
            personal_optimizer=_sgd(c),
        )
    ),
    'apfl': Method(
        lambda c: apfl.apfl_plan(
            client_epochs=c.client_epochs,
            personal_epochs=c.personal_epochs,
            client_optimizer=_sgd(c),
            personal_optimizer=_sgd(c),
            initial_alpha=c.apfl_alpha,
        )
    ),
    'fedper': Method(
        lambda c: fedper.fedper_plan(client_epochs=c.client_epochs, client_optimizer=_sgd(c)),
        image_classifiers.HEAD,
    ),
    'fedrep': Method(
        lambda c: fedrep.fedrep_plan(
            head_epochs=c.fedrep_head_epochs,
            body_epochs=c.client_epochs,
            head_optimizer=_sgd(c),
            body_optimizer=_sgd(c),
        ),
        image_classifiers.HEAD,
    ),
    # LG-FedAvg is FedPer's plan with the other layers local (`fedpersonal.algorithms.lg_fedavg`).
    'lg_fedavg': Method(
        lambda c: fedper.fedper_plan(client_epochs=c.client_epochs, client_optimizer=_sgd(c)),
        image_classifiers.BODY,
    ),
    'fedavg_ft': Method(lambda c: _plain(c, 0.0), finetune=True),
    # The head kept (not 'initial'): no phase trains it, so it is every client's initial one, as the evaluation reads.
    'fedbabu': Method(
        lambda c: dataclasses.replace(
            fedbabu.fedbabu_plan(client_epochs=c.client_epochs, client_optimizer=_sgd(c)),
            local_start=client_plan.KEPT,
        ),
        image_classifiers.HEAD,
        finetune=True,
    ),
    'fed_recon': Method(
        lambda c: fed_recon.fed_recon_plan(
            client_optimizer=_sgd(c), reconstruction_optimizer=_sgd(c), dataset_split=RECON_SPLIT
        ),
        image_classifiers.HEAD,
    ),
    'furl_head': Method(
        lambda c: furl.furl_plan(
            client_epochs=c.client_epochs, client_optimizer=_sgd(c), private_norm_regularization=c.furl_private_norm
        ),
        image_classifiers.HEAD,
    ),
    'per_fedavg': Method(lambda c: _per_fedavg(c, hessian_free=False), adapts=True),
    'per_fedavg_hf': Method(lambda c: _per_fedavg(c, hessian_free=True), adapts=True),
    'pfedme': Method(
        lambda c: pfedme.pfedme_plan(
            lam=c.pfedme_lambda,
            inner_steps=c.pfedme_k,
            personal_learning_rate=c.pfedme_personal_learning_rate,
            learning_rate=c.client_learning_rate,
            client_epochs=c.client_epochs,
            mu=0.001,
        )
    ),
    'fedala': Method(_fedala),
    'fedrod': Method(
        lambda c: fedrod.fedrod_plan(client_epochs=c.client_epochs, client_optimizer=_sgd(c)),
        image_classifiers.HEAD,
        phased_model=fedrod_model_fn,
    ),
}


def load_data(config: PflBenchmarkConfig) -> pfllib.PfllibImageData:
    """The pooled images and their PFLlib partition."""
    if config.dataset == 'synthetic':
        half = config.synthetic_examples // 2
        source = federated_images.load_source(
            'generated', None, generated_train=half, generated_test=config.synthetic_examples - half, seed=0
        )
    else:
        source = federated_images.load_source(config.dataset, config.data_dir, tfds_data_dir=config.tfds_data_dir)
    return pfllib.federate(
        source,
        config.partition,
        num_clients=config.num_clients,
        class_per_client=config.class_per_client,
        alpha=config.dirichlet_alpha,
        batch_size=config.batch_size,
        train_ratio=config.train_ratio,
        seed=config.partition_seed,
    )


def _loss_fn() -> tf.keras.losses.Loss:
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _metrics_fn() -> list[tf.keras.metrics.Metric]:
    return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]


def element_spec(data: pfllib.PfllibImageData) -> collections.OrderedDict:
    """The element spec of the clients' batches."""
    return collections.OrderedDict(
        x=tf.TensorSpec([None, *data.x.shape[1:]], tf.float32), y=tf.TensorSpec([None], tf.int32)
    )


def model_fn_for(data: pfllib.PfllibImageData, seed: int, local_layers: tuple[str, ...] | str) -> Callable[[], Any]:
    """A partially local CNN: `local_layers` (names, or ``'all'``) on the clients, the others global."""
    spec = element_spec(data)

    height, width, channels = data.x.shape[1:]

    def model_fn():
        keras_model = image_classifiers.fedavg_cnn((height, width, channels), data.num_classes, seed=seed)
        layers = [layer for layer in keras_model.layers if layer.weights]
        local = [layer for layer in layers if local_layers == 'all' or layer.name in local_layers]
        shared = [layer for layer in layers if layer not in local]
        return models.from_keras_model(keras_model, input_spec=spec, global_layers=shared, local_layers=local)

    return model_fn


class Benchmark:
    """One partition's clients, batched as the methods train and evaluate on them; each client's train examples in
    the order of ``config.seed`` (`train_rows`: a permutation of its partition rows)."""

    def __init__(self, config: PflBenchmarkConfig, data: pfllib.PfllibImageData):
        self.config, self.data = config, data
        self.client_ids = data.client_ids
        rng = np.random.default_rng(config.seed)
        self.train_rows = [rng.permutation(rows) for rows in data.partition.train]
        pooled = collections.OrderedDict(x=data.x, y=data.y)
        train = client_data_lib.from_partition(pooled, self.train_rows, self.client_ids)
        self.train = {c: train.create_tf_dataset_for_client(c) for c in self.client_ids}
        self._test = data.client_data('test')

    def train_dataset(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.batch(self.config.batch_size, drop_remainder=True)  # As PFLlib's DataLoader (drop_last).

    def test_dataset(self, client_id: str) -> tf.data.Dataset:
        return self._test.create_tf_dataset_for_client(client_id).batch(EVAL_BATCH)


def _accuracies(result: Any) -> dict[str, float]:
    per_client = np.asarray(result['per_client']['accuracy'], dtype=np.float64)
    return {
        'accuracy': float(result['eval']['accuracy']),
        'mean_client_accuracy': float(per_client.mean()),
        'worst_client_accuracy': float(per_client.min()),
    }


def make_evaluation(
    benchmark: Benchmark,
    plan: client_plan.ClientPlan,
    local_layers: tuple[str, ...],
    *,
    finetune: bool = False,
    adapts: bool = False,
    phased_model: Callable[[], Any] | None = None,
) -> Callable[..., dict[str, float]]:
    """``(global weights, every client's private state) -> metrics`` on every client's test data, each client with
    the model it predicts with (first fine-tuned on its train data with `finetune`): accuracy over all test
    examples, the mean and the worst client's accuracy. A stateless plan (FedRecon): ``global weights -> metrics``
    by ReconEval on each client's test data. `adapts`: each client predicts with the global model after one SGD
    step on its first train batch. `phased_model`: the model of a plan with model-defined losses (FedRoD's),
    which predicts with its `fedrod.prediction_model_fn`."""
    config = benchmark.config
    if plan.model_losses:
        if phased_model is None:
            raise ValueError('A plan with model-defined losses is evaluated with its model: give phased_model.')
        predict = evaluation.build_private_state_eval(
            fedrod.prediction_model_fn(phased_model, element_spec(benchmark.data)),
            loss_fn=_loss_fn,
            metrics_fn=_metrics_fn,
            simulation=config.simulation,
        )
        return lambda weights, private_states: _accuracies(
            evaluation.evaluate_clients(
                predict,
                weights,
                benchmark.client_ids,
                benchmark.test_dataset,
                [fedrod.prediction_state(p) for p in private_states],
                cache_key='test',
            )
        )
    if not plan.stateful:
        recon_eval = evaluation.build_recon_eval(
            model_fn_for(benchmark.data, config.seed, local_layers),
            loss_fn=_loss_fn,
            metrics_fn=_metrics_fn,
            reconstruction_optimizer=_sgd(config),
            dataset_split=RECON_SPLIT,
            simulation=config.simulation,
        )
        return lambda weights: _accuracies(
            evaluation.evaluate_clients(
                recon_eval, weights, benchmark.client_ids, benchmark.test_dataset, cache_key='test'
            )
        )
    # A personal or fine-tuned model is evaluated as a model whose weights are all the client's own.
    own = plan.personal or finetune or adapts
    model_fn = model_fn_for(benchmark.data, config.seed, 'all' if own else local_layers)
    global_model_fn = model_fn_for(benchmark.data, config.seed, ())
    evaluate = evaluation.build_private_state_eval(
        model_fn, loss_fn=_loss_fn, metrics_fn=_metrics_fn, simulation=config.simulation
    )
    no_globals = ModelWeights([], [])
    tune = None
    if finetune:
        if local_layers not in ((), image_classifiers.HEAD):  # The full model is the globals, then the locals.
            raise ValueError(f'fine-tuning needs the head or nothing local, got {local_layers}.')
        with backends.use(config.simulation, strategy=config.engine_strategy):
            tune = backends.build_process(
                fedbabu.finetune_plan(epochs=config.finetune_epochs, optimizer=_sgd(config)),
                model_fn,
                loss_fn=_loss_fn,
                server_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                group_size=config.group_size,
                name='fine-tuning',
            )

    def client_evaluation(weights: Any, private_states: list[Any]) -> dict[str, float]:
        states = [client_plan.personalized_weights(plan, weights, p) for p in private_states]
        if tune is not None:
            full = [ModelWeights(list(weights.trainable) + list(s.trainable), []) for s in states]
            train = [benchmark.train_dataset(benchmark.train[c]) for c in benchmark.client_ids]
            states = list(tune.run_round(tune.initialize(), train, full).private_states)
        if adapts:
            first_batches = [next(iter(benchmark.train_dataset(benchmark.train[c]))) for c in benchmark.client_ids]
            lr = config.client_learning_rate
            states = [per_fedavg.adapt(global_model_fn, weights, b, lr, _loss_fn) for b in first_batches]
        result = evaluation.evaluate_clients(
            evaluate,
            no_globals if own else weights,
            benchmark.client_ids,
            benchmark.test_dataset,
            states,
            cache_key='test',
        )
        return _accuracies(result)

    return client_evaluation


def run_method(benchmark: Benchmark, outputs: program.ExperimentOutputs, name: str) -> dict[str, Any]:
    """Trains one method on every client every round; its row (accuracy at the last round, best, slope, clients)."""
    config, spec = benchmark.config, METHOD_SPECS[name]
    plan = spec.plan(config)
    phased_model = spec.phased_model(benchmark.data, config.seed) if spec.phased_model is not None else None
    common_parts: dict[str, Any] = dict(
        server_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
        group_size=config.group_size,
        name=METHOD_NAMES[name],
    )
    with backends.use(config.simulation, strategy=config.engine_strategy):
        if phased_model is not None:  # Its loss and metrics are the model's.
            process = backends.build_process(
                plan, phased_model, element_spec=element_spec(benchmark.data), **common_parts
            )
        else:
            process = backends.build_process(
                plan,
                # A personal copy is of a model whose weights are all global; its evaluation model has them all local.
                model_fn_for(benchmark.data, config.seed, () if plan.personal else spec.local_layers),
                loss_fn=_loss_fn,
                metrics_fn=_metrics_fn,
                **common_parts,
            )
    evaluate = make_evaluation(
        benchmark, plan, spec.local_layers, finetune=spec.finetune, adapts=spec.adapts, phased_model=phased_model
    )
    common: dict[str, Any] = dict(
        outputs=outputs,
        client_data=benchmark.train,
        dataset_fn=benchmark.train_dataset,
        evaluation_name='test',
        name=f'{name} seed {config.seed}',
    )
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


def _run_path(name: str, seed: int) -> str:
    """The directory of one method's run with one seed."""
    return os.path.join(name, f'seed{seed}')


def _finished(config: PflBenchmarkConfig, name: str, seed: int) -> dict[str, Any] | None:
    """The row of a run that finished earlier (its ``results.json``, written last), else None."""
    path = os.path.join(config.output_dir, _run_path(name, seed), 'results.json')
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def run(config: PflBenchmarkConfig) -> dict[str, Any]:
    """Runs every configured method with every seed on the partition (runs that finished earlier are read back);
    writes each run's row, results.json (the rows over seeds) and accuracy_by_round.png. MovieLens
    (`MOVIELENS_DATASETS`): the rating block of `fedpersonal.tasks.pfl_benchmark_movielens`, rows by RMSE."""
    run_record.check_output_dir(config)
    program.write_json(os.path.join(config.output_dir, 'config.json'), dataclasses.asdict(config))
    data: Any
    make_benchmark: Callable[..., Any]
    run_one: Callable[..., dict[str, Any]]
    if config.dataset in MOVIELENS_DATASETS:
        data = pfl_benchmark_movielens.load_data(config)
        partition, metric = data.partition, pfl_benchmark_movielens.METRIC
        make_benchmark, run_one = pfl_benchmark_movielens.MovieLensBenchmark, pfl_benchmark_movielens.run_method
    else:
        data = load_data(config)
        partition, metric, make_benchmark, run_one = config.partition, 'accuracy', Benchmark, run_method
    statistics = data.statistics()
    logging.info(
        '%s partition of %s: %s',
        partition,
        data.name,
        {k: v for k, v in statistics.items() if k != 'label_counts'},
    )
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    pending = []
    for name in config.configurations:
        for seed in config.seeds:
            row = _finished(config, name, seed)
            if row is None:
                pending.append((name, seed))
            else:
                logging.info('[%s seed %d] finished earlier: its row is read back', name, seed)
                runs[(name, seed)] = row
    benchmarks: dict[int, Any] = {}
    description = f'[pfl_benchmark] runs (method x seed; {len(runs)} finished earlier)'
    for name, seed in progress.logged(pending, len(pending), description, delay=0.0, interval=1.0):
        if seed not in benchmarks:
            benchmarks[seed] = make_benchmark(dataclasses.replace(config, seed=seed), data)
        tf.random.set_seed(seed)  # Op-level seeds combine with the same graph-level seed whatever ran before.
        outputs = program.ExperimentOutputs(config.output_dir, _run_path(name, seed))
        started = time.time()
        row = {'name': METHOD_NAMES[name], 'method': name, 'seed': seed}
        row.update(run_one(benchmarks[seed], outputs, name))
        outputs.write_json('results.json', row)  # Written last: the run is finished.
        runs[(name, seed)] = row
        logging.info(
            '[%s seed %d] %s %.4f (best %.4f) in %.0fs',
            name,
            seed,
            metric,
            row[metric],
            row[f'best_{metric}'],
            time.time() - started,
        )
    results: dict[str, Any] = {
        'dataset': data.name,
        'partition': partition,
        'clients': len(data.client_ids),
        'metric': metric,
        'seeds': list(config.seeds),
        'statistics': statistics,
        'rows': [
            pfl_benchmark_results.over_seeds([runs[(name, seed)] for seed in config.seeds], config.seeds, metric)
            for name in config.configurations
        ],
    }
    figure = pfl_benchmark_results.plot_by_round(results, os.path.join(config.output_dir, f'{metric}_by_round.png'))
    results['figures'] = {f'{metric}_by_round': figure}
    program.write_json(os.path.join(config.output_dir, 'results.json'), results)
    return results
