"""The rows of the personalization benchmark (`fedpersonal.tasks.pfl_benchmark`): each algorithm module's
registered rows (`fedpersonal.registry`: its ``BENCHMARK_ROWS`` and ``BenchmarkOptions``) as `Method`s of the
benchmark's config, PFLlib's CNN or the user's model, and which of its layers stay on the clients.

A row's math and defaults are its module's (e.g. ``fedprox``: `fedpersonal.algorithms.fedprox`; ``per_fedavg`` and
``per_fedavg_hf``: `fedpersonal.algorithms.per_fedavg`); nothing here names an algorithm. The rows run by default
are PFLlib's leaderboard's (``leaderboard=`` positions); SCAFFOLD, MOON and FedDBE run when named. FedBN
(`fedpersonal.algorithms.fedbn`) is not a row: PFLlib's CNN has no batch normalization, on which FedBN is FedAvg.

The model is PFLlib's CNN (`image_classifiers.fedavg_cnn`) or the user's ``--model`` factory
(`fedpersonal.models.keras_factory`): the head (`registry.HEAD`, `image_classifiers.HEAD` of the CNN) is the
model's last layer with weights (PFLlib's ``fc``), the body (`registry.BODY`) its other layers with weights
(`local_layer_names`).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import models
from fedpersonal import registry
from fedpersonal.core import client_plan
from fedpersonal.data import dataset_split
from fedpersonal.data import pfllib
from fedpersonal.models import image_classifiers
from fedpersonal.models import keras_factory
from fedpersonal.tasks import pfl_benchmark_config
from fedpersonal.tasks.pfl_benchmark_config import PflBenchmarkConfig


@dataclasses.dataclass(frozen=True)
class Method:
    """A benchmark row: its client plan (from the config) and the model's layers that stay on the clients."""

    plan: Callable[[PflBenchmarkConfig], client_plan.ClientPlan]
    local_layers: tuple[str, ...] = ()
    finetune: bool = False  # Each client fine-tunes its whole model on its train data before evaluation.
    adapts: bool = False  # Evaluated after one local step (`per_fedavg.adapt`).
    # A plan with model-defined losses (FedRoD): its model, from the data and the seed.
    phased_model: Callable[[pfllib.PfllibImageData, int, str | None], Callable[[], Any]] | None = None
    # How the server weighs the clients' updates (SCAFFOLD, as PFLlib's: the uniform mean).
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES
    # The method's own layers around the benchmark's Keras model (FedDBE's representation bias).
    keras_transform: Callable[[tf.keras.Model], tf.keras.Model] | None = None


def sgd(config: PflBenchmarkConfig) -> tff.learning.optimizers.Optimizer:
    """The clients' optimizer: SGD at the configured learning rate (PFLlib's)."""
    return tff.learning.optimizers.build_sgdm(learning_rate=config.client_learning_rate)


RECON_SPLIT = dataset_split.ReconstructionSplit()  # FedRecon's support/query halves of a client's data.


def keras_model(data: pfllib.PfllibImageData, seed: int, model: str | None = None) -> tf.keras.Model:
    """The benchmark's Keras model for `data`'s images: PFLlib's CNN, or factory `model` (``'module:function'``,
    the ``--model`` flag; checked by `keras_factory.build`)."""
    height, width, channels = (int(d) for d in data.x.shape[1:])
    if model is None:
        return image_classifiers.fedavg_cnn((height, width, channels), data.num_classes, seed=seed)
    return keras_factory.build(model, (height, width, channels), data.num_classes, seed=seed)


def local_layer_names(keras_model: tf.keras.Model, local_layers: tuple[str, ...] | str) -> list[str]:
    """The names of `keras_model`'s layers with weights that `local_layers` keeps on the clients: ``'all'``,
    `image_classifiers.HEAD` (the last layer), `image_classifiers.BODY` (the others), or names."""
    layers = [layer.name for layer in keras_model.layers if layer.weights]
    if local_layers == 'all':
        return layers
    if tuple(local_layers) == image_classifiers.HEAD:
        return layers[-1:]
    if tuple(local_layers) == image_classifiers.BODY:
        return layers[:-1]
    return [name for name in layers if name in local_layers]


def settings(config: PflBenchmarkConfig) -> registry.Settings:
    """What every row's plan reads from the benchmark's config besides its own options."""
    return registry.Settings(
        client_epochs=config.client_epochs,
        client_learning_rate=config.client_learning_rate,
        batch_size=config.batch_size,
        seed=config.seed,
        personal_epochs=config.personal_epochs,
        num_clients=config.num_clients,
    )


def _method(row: registry.Row, declaration: registry.Declaration, options_class: type | None) -> Method:
    """The benchmark's view of a registered row: its plan from the config (the module's own options, checked)."""

    def plan(config: PflBenchmarkConfig) -> client_plan.ClientPlan:
        return row.plan(settings(config), registry.options_from(declaration, config, options_class))

    phased_model = None
    if row.phased_model is not None:
        wrap = row.phased_model

        def phased_model(data: pfllib.PfllibImageData, seed: int, model: str | None = None) -> Callable[[], Any]:
            return lambda: wrap(keras_model(data, seed, model), data.num_classes)

    named = {registry.HEAD: image_classifiers.HEAD, registry.BODY: image_classifiers.BODY}
    local_layers = named[row.local_layers] if isinstance(row.local_layers, str) else row.local_layers
    return Method(
        plan,
        tuple(local_layers),
        finetune=row.finetune,
        adapts=row.adapts,
        phased_model=phased_model,
        client_weighting=(
            tff.learning.ClientWeighting.UNIFORM if row.uniform_weighting else tff.learning.ClientWeighting.NUM_EXAMPLES
        ),
        keras_transform=row.keras_transform,
    )


METHOD_SPECS: dict[str, Method] = {
    name: _method(*registered) for name, registered in registry.load_rows(pfl_benchmark_config.DECLARATIONS).items()
}


def loss_fn() -> tf.keras.losses.Loss:
    """The loss of the CNN's logits."""
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def metrics_fn() -> list[tf.keras.metrics.Metric]:
    """The metrics every method reports: accuracy."""
    return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]


def element_spec(data: pfllib.PfllibImageData) -> collections.OrderedDict:
    """The element spec of the clients' batches."""
    return collections.OrderedDict(
        x=tf.TensorSpec([None, *data.x.shape[1:]], tf.float32), y=tf.TensorSpec([None], tf.int32)
    )


def model_fn_for(
    data: pfllib.PfllibImageData,
    seed: int,
    local_layers: tuple[str, ...] | str,
    model: str | None = None,
    transform: Callable[[tf.keras.Model], tf.keras.Model] | None = None,
) -> Callable[[], Any]:
    """A partially local model (PFLlib's CNN, or factory `model`, see `keras_model`; `transform` of it, a method's
    `Method.keras_transform`): `local_layers` (see `local_layer_names`) on the clients, the others global."""
    spec = element_spec(data)

    def model_fn():
        built = keras_model(data, seed, model)
        if transform is not None:
            built = transform(built)
        layers = [layer for layer in built.layers if layer.weights]
        names = local_layer_names(built, local_layers)
        local = [layer for layer in layers if layer.name in names]
        shared = [layer for layer in layers if layer not in local]
        return models.from_keras_model(built, input_spec=spec, global_layers=shared, local_layers=local)

    return model_fn
