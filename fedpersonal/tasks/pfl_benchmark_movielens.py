"""The personalization benchmark's MovieLens 100K block: matrix factorization, one client per user.

The methods of the benchmark that apply to matrix factorization, on the task of `fedpersonal.tasks.movielens_mf`
(reused, not restated: its data loading and per-user time split, its personal model with the user embedding local
and the items global, its table model, MSE loss and rating metrics, its FedRecon split and reconstruction). Every
user is a client and trains every round on the first 80% of its ratings by time (`movielens_mf.load_data`'s time
split). Every `rounds_per_eval` rounds the row is evaluated on the next 10% (validation); the model of the best
validation round (the server state and, for a stateful method, every client's private state of that round: early
stopping's restore-best, `program.EarlyStopping`) is tested once, on the last 10%. With `client_learning_rates`, each
method's client learning rate is selected among them on the validation RMSE of the first seed
(`fedpersonal.tasks.pfl_benchmark`). Rows:

* ``fedavg``: FedAvg of the table model, every weight global (the user embeddings stored on the server, footnote 4
  of the FedRecon paper: movielens_mf's ``fedavg_standard``), StandardEval;
* ``fedavg_ft``: the same, each client then fine-tuning its personal model (the items and its own table row) on its
  train ratings for `finetune_epochs` epochs before every evaluation (`fedbabu.finetune_plan`);
* ``fed_recon``: Federated Reconstruction (`fed_recon.fed_recon_plan`), the user embedding reconstructed every round
  and never kept; ReconEval on each client's test ratings (reconstructed on their support half, scored on the
  query half), as the image block evaluates it;
* ``fedper`` / ``furl``: the user embedding a persistent private state kept on its client between rounds
  (`fedper.fedper_plan`, `furl.furl_plan` with its norm penalty `furl_private_norm`), the items averaged;
* ``ditto``: a personal copy of the whole personal model per client (`ditto.ditto_plan`), the global copy's user
  embedding a shared one (every weight of Ditto's global model is averaged; each client predicts with its copy).

Not rows: FedRep, FedBABU and LG-FedAvg split a network into a body and a head trained in turns or kept apart; here
the user embedding is the only local part and the item table the only global one, so FedRep and FedBABU are FedPer
with a schedule and LG-FedAvg is FedPer. FedBN: the model has no batch normalization. APFL, Per-FedAvg, pFedMe and
FedProx may be added the same way (their plans take any model).

The metric is RMSE over all test ratings (lower is better), with each client's RMSE (mean and worst) and the rating
accuracy of `movielens_mf` (a prediction within `accuracy_threshold` 0.5 of the rating); a row's curves are the
validation RMSE by round. A seed sets the models'
initial weights; the data, its cap of ratings per user and the split are `partition_seed`'s. A client's batches come
in time order every round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import client_state
from fedpersonal import evaluation
from fedpersonal import metrics as metrics_lib
from fedpersonal import models
from fedpersonal import program
from fedpersonal.algorithms import ditto
from fedpersonal.algorithms import fed_recon
from fedpersonal.algorithms import fedbabu
from fedpersonal.algorithms import fedper
from fedpersonal.algorithms import fedprox
from fedpersonal.algorithms import furl
from fedpersonal.core import client_plan
from fedpersonal.data import movielens as movielens_data
from fedpersonal.models import matrix_factorization as mf
from fedpersonal.program import training_loop
from fedpersonal.tasks import movielens_mf
from fedpersonal.tasks.pfl_benchmark_config import METHOD_NAMES
from fedpersonal.tasks.pfl_benchmark_config import PflBenchmarkConfig
from fedpersonal.tasks.pfl_benchmark_results import summarize

PARTITION = 'by_user'
METRIC = 'rmse'
SPLITS = ('validation', 'test')  # The evaluation splits: the periodic one (selection), then the test (once).
ModelWeights = tff.learning.models.ModelWeights


def mf_config(config: PflBenchmarkConfig, seed: int) -> movielens_mf.MovieLensMFConfig:
    """The `movielens_mf` task's configuration of a benchmark run with `seed` (its reconstruction split and steps
    are movielens_mf's defaults, those of configs/movielens_100k_table1.flags)."""
    generated = config.dataset == 'movielens_synthetic'
    return movielens_mf.MovieLensMFConfig(
        dataset='synthetic' if generated else 'movielens',
        data_dir=None if generated else config.data_dir,
        variant='100k',
        configurations=('fedrecon',),
        synthetic_num_users=config.synthetic_users,
        synthetic_num_items=config.synthetic_items,
        synthetic_seed=config.partition_seed,
        max_examples_per_client=config.max_examples_per_client,
        num_latent_factors=config.num_latent_factors,
        batch_size=config.batch_size,
        client_learning_rate=config.client_learning_rate,
        reconstruction_learning_rate=config.reconstruction_learning_rate,
        simulation=config.simulation,
        group_size=config.group_size,
        seed=seed,
    )


@dataclasses.dataclass
class MovieLensData:
    """The ratings split by time per user (`movielens_mf.PreparedData`) and the users that are clients."""

    prepared: movielens_mf.PreparedData
    name: str
    client_ids: list[str]
    partition: str = PARTITION

    def statistics(self) -> dict[str, Any]:
        stats = movielens_data.dataset_statistics(self.prepared.data)
        return {k: v for k, v in stats.items() if not isinstance(v, dict)}


def load_data(config: PflBenchmarkConfig) -> MovieLensData:
    """MovieLens 100K from ``config.data_dir`` (or generated ratings), split by time per user; the clients are the
    users with train, validation and test ratings."""
    prepared = movielens_mf.load_data(mf_config(config, config.partition_seed))
    evaluated = set(prepared.time_val.client_ids) & set(prepared.time_test.client_ids)
    clients = [c for c in prepared.time_train.client_ids if c in evaluated]
    name = 'movielens_synthetic' if config.dataset == 'movielens_synthetic' else 'movielens_100k'
    return MovieLensData(prepared, name, clients)


class MovieLensBenchmark:
    """One seed's models and the clients' train, validation and test datasets (the `movielens_mf` task with that
    seed and the config's client learning rate)."""

    def __init__(self, config: PflBenchmarkConfig, data: MovieLensData):
        self.config, self.data = config, data
        self.client_ids = data.client_ids
        self.task = movielens_mf.MovieLensMFTask(mf_config(config, config.seed), data.prepared)
        train = data.prepared.time_train
        self.train = {c: train.create_tf_dataset_for_client(c) for c in self.client_ids}
        self._evaluated = dict(zip(SPLITS, (data.prepared.time_val, data.prepared.time_test)))
        self._built: dict[str, Any] = {}

    def built(self, key: str, build: Callable[[], Any]) -> Any:
        """`build()` once per benchmark (a computation both splits' evaluations and several rows use)."""
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]

    def model_fn(self, local: str) -> Callable[[], Any]:
        """The personal model: ``'user'`` local (the task's), ``'none'`` or ``'all'`` (a personal copy)."""
        if local == 'user':
            return self.task.personal_model_fn
        cfg = self.task.config

        def model_fn():
            keras_model, global_layers, local_layers = mf.personal_keras_model(
                self.task.num_items, cfg.num_latent_factors, add_biases=cfg.add_biases, seed=cfg.seed
            )
            layers = global_layers + local_layers
            return models.from_keras_model(
                keras_model,
                input_spec=mf.personal_input_spec(),
                global_layers=[] if local == 'all' else layers,
                local_layers=layers if local == 'all' else [],
            )

        return model_fn

    def eval_dataset(self, split: str, client_id: str, table: bool = False) -> tf.data.Dataset:
        """A client's ratings of `split` (one of `SPLITS`), for the table model or the personal one."""
        dataset = self._evaluated[split].create_tf_dataset_for_client(client_id)
        return self.task.table_dataset_fn_eval(dataset) if table else self.task.personal_dataset_fn(dataset)


def _sgd(learning_rate: float) -> tff.learning.optimizers.Optimizer:
    return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)


def plan_for(name: str, benchmark: MovieLensBenchmark) -> client_plan.ClientPlan:
    """The client plan of a MovieLens row (see the module docstring)."""
    config = benchmark.config
    client = _sgd(config.client_learning_rate)
    if name in ('fedavg', 'fedavg_ft'):
        return fedprox.fedprox_plan(mu=0.0, client_epochs=config.client_epochs, client_optimizer=client)
    if name == 'fed_recon':
        return fed_recon.fed_recon_plan(
            client_optimizer=client,
            reconstruction_optimizer=_sgd(config.reconstruction_learning_rate),
            dataset_split=benchmark.task.config.split,
        )
    if name == 'fedper':
        return fedper.fedper_plan(client_epochs=config.client_epochs, client_optimizer=client)
    if name == 'furl':
        return furl.furl_plan(
            client_epochs=config.client_epochs,
            client_optimizer=client,
            private_norm_regularization=config.algorithm_option('furl_private_norm'),
        )
    if name == 'ditto':
        return ditto.ditto_plan(
            lam=config.algorithm_option('ditto_lambda'),
            client_epochs=config.client_epochs,
            personal_epochs=config.personal_epochs,
            client_optimizer=client,
            personal_optimizer=_sgd(config.client_learning_rate),
        )
    raise ValueError(f'{name!r} is not a MovieLens row.')


def _rmse_metrics(result: Any) -> dict[str, float]:
    """RMSE over every test rating, each client's (mean, worst) and the rating accuracy over every test rating."""
    per_client = metrics_lib.summarize_per_client({k: np.asarray(v) for k, v in result['per_client'].items()})['rmse']
    return {
        'rmse': float(result['eval']['rmse']),
        'accuracy': float(result['eval']['accuracy']),
        'mean_client_rmse': float(per_client['mean']),
        'worst_client_rmse': float(per_client['max']),
    }


def make_evaluation(
    benchmark: MovieLensBenchmark, name: str, plan: client_plan.ClientPlan, split: str
) -> Callable[..., Any]:
    """The row's evaluation on every client's ratings of `split`: ``global weights -> metrics`` (FedAvg:
    StandardEval of the table model; FedRecon: ReconEval), else ``(global weights, private states) -> metrics``,
    each client with the model it predicts with."""
    task, ids = benchmark.task, benchmark.client_ids
    cache = split  # One cache of prepared datasets per split and model kind (the table's, the personal one's).
    if name == 'fedavg':

        def standard(weights: Any, private_states: Any = None) -> dict[str, float]:
            del private_states  # The table model has no local weights (the plan's private states are empty).
            result = evaluation.evaluate_clients(
                task.standard_eval(),
                weights,
                ids,
                lambda c: benchmark.eval_dataset(split, c, table=True),
                cache_key=f'{cache}:table',
            )
            return _rmse_metrics(result)

        return standard

    def split_dataset(client_id: str) -> tf.data.Dataset:
        return benchmark.eval_dataset(split, client_id)

    if name == 'fed_recon':
        return lambda weights: _rmse_metrics(
            evaluation.evaluate_clients(task.recon_eval(), weights, ids, split_dataset, cache_key=f'{cache}:personal')
        )
    own = name in ('ditto', 'fedavg_ft')
    evaluate = benchmark.built(
        f'evaluation:{own}',
        lambda: evaluation.build_private_state_eval(
            benchmark.model_fn('all' if own else 'user'),
            loss_fn=task.loss_fn,
            metrics_fn=task.metrics_fn,
            simulation=benchmark.config.simulation,
        ),
    )
    if name == 'fedavg_ft':
        return _finetuned_evaluation(benchmark, evaluate, split)

    def client_evaluation(weights: Any, private_states: list[Any]) -> dict[str, float]:
        states = [client_plan.personalized_weights(plan, weights, p) for p in private_states]
        result = evaluation.evaluate_clients(
            evaluate,
            ModelWeights([], []) if own else weights,
            ids,
            split_dataset,
            states,
            cache_key=f'{cache}:personal',
        )
        return _rmse_metrics(result)

    return client_evaluation


def _finetuned_evaluation(
    benchmark: MovieLensBenchmark, evaluate: Any, split: str
) -> Callable[[Any], dict[str, float]]:
    """FedAvg+FT: each client's personal model (the table's items and its own row) fine-tuned on its train ratings,
    then evaluated on `split`."""
    config, task = benchmark.config, benchmark.task

    def build_tuning() -> Any:
        with backends.use(config.simulation, strategy=config.engine_strategy):
            return backends.build_process(
                fedbabu.finetune_plan(epochs=config.finetune_epochs, optimizer=_sgd(config.client_learning_rate)),
                benchmark.model_fn('all'),
                loss_fn=task.loss_fn,
                server_optimizer=_sgd(1.0),
                group_size=config.group_size,
                name='fine-tuning',
            )

    tune = benchmark.built('fine-tuning', build_tuning)
    users = [int(c) for c in benchmark.client_ids]  # A client id is its user's row of the table.

    def finetuned(weights: Any, private_states: Any = None) -> dict[str, float]:
        del private_states  # Empty: the table model is all global.
        table = task.table_keras_model()
        for variable, value in zip(table.trainable_variables, weights.trainable):
            variable.assign(value)
        items = mf.item_weights_from_table_model(table)  # The personal model's globals, then its user row.
        user_table = table.get_layer('UserTable').embeddings.numpy()
        states = [ModelWeights(items + [user_table[u : u + 1]], []) for u in users]
        train = [task.personal_dataset_fn(benchmark.train[c]) for c in benchmark.client_ids]
        # A diverging fine-tuning is this evaluation's NaN (a row's number), not a stop: the round as it is.
        tuned = list(tune.run_round(tune.initialize(), train, states, non_finite='ignore').private_states)
        result = evaluation.evaluate_clients(
            evaluate,
            ModelWeights([], []),
            benchmark.client_ids,
            lambda c: benchmark.eval_dataset(split, c),
            tuned,
            cache_key=f'{split}:personal',
        )
        return _rmse_metrics(result)

    return finetuned


def build_process(benchmark: MovieLensBenchmark, name: str, plan: client_plan.ClientPlan) -> Any:
    """The row's training process on the configured backend (FedAvg: the table model; Ditto: the personal model
    with every weight global, its copy kept by the plan; the others: the user embedding local)."""
    config, task = benchmark.config, benchmark.task
    table = name in ('fedavg', 'fedavg_ft')
    with backends.use(config.simulation, strategy=config.engine_strategy):
        return backends.build_process(
            plan,
            task.table_model_fn if table else benchmark.model_fn('none' if plan.personal else 'user'),
            loss_fn=task.loss_fn,
            metrics_fn=task.metrics_fn,
            server_optimizer=_sgd(1.0),
            group_size=config.group_size,
            name=METHOD_NAMES[name],
        )


def run_method(benchmark: MovieLensBenchmark, outputs: program.ExperimentOutputs, name: str) -> dict[str, Any]:
    """Trains one row on every client every round, evaluated on the validation ratings; tests the model of its best
    validation round once. Its row: the test metrics of that model, the best round and its validation RMSE, the
    validation curves (`summarize` of the validation evaluations)."""
    config, task = benchmark.config, benchmark.task
    plan = plan_for(name, benchmark)
    process = build_process(benchmark, name, plan)
    validate, test = (make_evaluation(benchmark, name, plan, split) for split in SPLITS)
    table = name in ('fedavg', 'fedavg_ft')
    # Restore-best only (no patience): every seed runs the same rounds, so its curves average over seeds.
    stopping = program.EarlyStopping(METRIC, keep_client_states=plan.stateful)
    common: dict[str, Any] = dict(
        outputs=outputs,
        client_data=benchmark.train,
        dataset_fn=task.table_dataset_fn if table else task.personal_dataset_fn,
        evaluation_name='validation',
        stopping=stopping,
        name=f'{name} seed {config.seed}',
    )
    if not plan.stateful:
        state, _ = program.run_process(process, config, evaluation_fn=validate, **common)
        tested = test(process.get_model_weights(stopping.best_state if stopping.best_round else state))
    else:
        template = process.initial_private_state()
        initial = training_loop.from_model_weights(template)
        store = program.open_store(
            config.state_store, outputs, client_state.spec_of(initial), lambda client_id: [a.copy() for a in initial]
        )
        with store:
            state, _ = program.run_process(
                process, config, client_evaluation_fn=validate, client_state_store=store, **common
            )
            best = stopping.best_client_states(store, benchmark.client_ids)
            states = [training_loop.unflatten_private_state(s, template) for s in best]
        tested = test(process.get_model_weights(stopping.best_state if stopping.best_round else state), states)
    row = summarize(
        outputs.read_metrics(), seconds_per_round=outputs.median_round_seconds(), metric=METRIC, split='validation'
    )
    row.update(tested)
    row.update(
        {
            'best_round': stopping.best_round,
            f'validation_{METRIC}': stopping.best_value,
            'client_learning_rate': config.client_learning_rate,
        }
    )
    return row
