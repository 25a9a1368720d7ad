"""PFLlib's evaluation on the personalization benchmark (`fedpersonal.tasks.pfl_benchmark`): each client's test
data with the model it predicts with (the global model, or its personal one: `client_plan.personalized_weights`),
accuracy = correct test predictions over all test examples, plus the mean and the worst client's accuracy.

`Benchmark` holds one partition's clients, batched as the methods train and evaluate on them.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal import evaluation
from fedpersonal.algorithms import fedbabu
from fedpersonal.algorithms import fedrod
from fedpersonal.algorithms import per_fedavg
from fedpersonal.core import client_plan
from fedpersonal.data import client_data as client_data_lib
from fedpersonal.data import pfllib
from fedpersonal.models import image_classifiers
from fedpersonal.tasks import pfl_benchmark_methods as methods
from fedpersonal.tasks.pfl_benchmark_config import PflBenchmarkConfig

EVAL_BATCH = 100
ModelWeights = tff.learning.models.ModelWeights


class Benchmark:
    """One partition's clients, batched as the methods train and evaluate on them; each client's train examples in
    the order of ``config.seed`` (`train_rows`: a permutation of its partition rows).

    Raises:
      TooFewTrainRowsError: A client has fewer train rows than ``config.batch_size``: it would never train
        (`train_dataset` drops a last partial batch) yet be evaluated.
    """

    def __init__(self, config: PflBenchmarkConfig, data: pfllib.PfllibImageData):
        pfllib.check_train_rows([rows.size for rows in data.partition.train], config.batch_size)
        self.config, self.data = config, data
        self.client_ids = data.client_ids
        rng = np.random.default_rng(config.seed)
        self.train_rows = [rng.permutation(rows) for rows in data.partition.train]
        pooled = collections.OrderedDict(x=data.x, y=data.y)
        train = client_data_lib.from_partition(pooled, self.train_rows, self.client_ids)
        self.train = {c: train.create_tf_dataset_for_client(c) for c in self.client_ids}
        self._test = data.client_data('test')

    def train_dataset(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """A client's train batches: a last partial batch dropped, as PFLlib's DataLoader (drop_last); counted by
        `pfllib.partial_batches`."""
        return dataset.batch(self.config.batch_size, drop_remainder=True)

    def round_train_dataset(self, client_id: str, round_num: int) -> tf.data.Dataset:
        """A client's train batches in round `round_num` with ``epoch_order='reshuffled'``: its train rows in an
        order of their own, drawn from ``(config.seed, round_num, client)`` (as PFLlib's ``DataLoader(shuffle=True)``
        draws one every epoch), a last partial batch dropped (a different one every round)."""
        index = self.client_ids.index(client_id)
        rng = np.random.default_rng([self.config.seed, round_num, index])
        rows = rng.permutation(self.train_rows[index])
        rows_data = collections.OrderedDict(x=self.data.x[rows], y=self.data.y[rows])
        return self.train_dataset(tf.data.Dataset.from_tensor_slices(rows_data))

    def adaptation_batch(self, client_id: str) -> Any | None:
        """The batch a client adapts on before evaluation (Per-FedAvg): its first train batch, all of its examples
        if it has fewer than a batch (PFLlib's dropped last batch would leave it none), None without any."""
        return next(iter(self.train[client_id].batch(self.config.batch_size)), None)

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
    transform: Callable[[Any], Any] | None = None,
) -> Callable[..., dict[str, float]]:
    """``(global weights, every client's private state) -> metrics`` on every client's test data, each client with
    the model it predicts with (first fine-tuned on its train data with `finetune`): accuracy over all test
    examples, the mean and the worst client's accuracy. A stateless plan (FedRecon): ``global weights -> metrics``
    by ReconEval on each client's test data. `adapts`: each client predicts with the global model after one SGD
    step on its `Benchmark.adaptation_batch`. `phased_model`: the model of a plan with model-defined losses (FedRoD's),
    which predicts with its `fedrod.prediction_model_fn`. `transform`: the method's layers around the Keras model
    (`pfl_benchmark_methods.Method.keras_transform`)."""
    config = benchmark.config
    if plan.model_losses:
        if phased_model is None:
            raise ValueError('A plan with model-defined losses is evaluated with its model: give phased_model.')
        predict = evaluation.build_private_state_eval(
            fedrod.prediction_model_fn(phased_model, methods.element_spec(benchmark.data)),
            loss_fn=methods.loss_fn,
            metrics_fn=methods.metrics_fn,
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
            methods.model_fn_for(benchmark.data, config.seed, local_layers, config.model),
            loss_fn=methods.loss_fn,
            metrics_fn=methods.metrics_fn,
            reconstruction_optimizer=methods.sgd(config),
            dataset_split=methods.RECON_SPLIT,
            simulation=config.simulation,
        )
        return lambda weights: _accuracies(
            evaluation.evaluate_clients(
                recon_eval, weights, benchmark.client_ids, benchmark.test_dataset, cache_key='test'
            )
        )
    # A personal or fine-tuned model is evaluated as a model whose weights are all the client's own.
    own = plan.personal or finetune or adapts
    model_fn = methods.model_fn_for(
        benchmark.data, config.seed, 'all' if own else local_layers, config.model, transform
    )
    global_model_fn = methods.model_fn_for(benchmark.data, config.seed, (), config.model, transform)
    evaluate = evaluation.build_private_state_eval(
        model_fn, loss_fn=methods.loss_fn, metrics_fn=methods.metrics_fn, simulation=config.simulation
    )
    no_globals = ModelWeights([], [])
    tune = None
    if finetune:
        if local_layers not in ((), image_classifiers.HEAD):  # The full model is the globals, then the locals.
            raise ValueError(f'fine-tuning needs the head or nothing local, got {local_layers}.')
        with backends.use(config.simulation, strategy=config.engine_strategy):
            tune = backends.build_process(
                fedbabu.finetune_plan(epochs=config.finetune_epochs, optimizer=methods.sgd(config)),
                model_fn,
                loss_fn=methods.loss_fn,
                server_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
                group_size=config.group_size,
                name='fine-tuning',
            )

    def client_evaluation(weights: Any, private_states: list[Any]) -> dict[str, float]:
        states = [client_plan.personalized_weights(plan, weights, p) for p in private_states]
        weights = client_plan.model_weights(plan, weights)  # Without the server's shared values (SCAFFOLD's c).
        if tune is not None:
            full = [ModelWeights(list(weights.trainable) + list(s.trainable), []) for s in states]
            train = [benchmark.train_dataset(benchmark.train[c]) for c in benchmark.client_ids]
            # A diverging fine-tuning is this evaluation's NaN (a row's number), not a stop: the round as it is.
            states = list(tune.run_round(tune.initialize(), train, full, non_finite='ignore').private_states)
        if adapts:
            lr = config.client_learning_rate
            batches = [benchmark.adaptation_batch(c) for c in benchmark.client_ids]
            states = [
                weights if b is None else per_fedavg.adapt(global_model_fn, weights, b, lr, methods.loss_fn)
                for b in batches
            ]
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
