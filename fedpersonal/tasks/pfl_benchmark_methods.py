"""The rows of the personalization benchmark (`fedpersonal.tasks.pfl_benchmark`): each method's client plan, from
the config, the layers of PFLlib's CNN that stay on the clients, and the model.

* ``fedavg`` / ``fedprox``: the global model (FedProx's proximal term, `fedpersonal.algorithms.fedprox`);
* ``ditto`` / ``apfl``: a personal copy of the model per client (APFL: mixed with the global one by alpha; PFLlib's
  variant by default, ``--apfl_variant=paper`` for the paper's, `fedpersonal.algorithms.apfl`);
* ``fedper`` / ``fedrep``: the head (``fc``) local; ``lg_fedavg``: the body (``conv1``, ``conv2``, ``fc1``) local;
* ``fedavg_ft`` / ``fedbabu``: FedAvg, and FedBABU (the head frozen at its initial values, only the body trained),
  each client fine-tuning its whole model on its train data for `finetune_epochs` epochs before every evaluation
  (`fedbabu.finetune_plan`; PFLlib fine-tunes once, after the last round);
* ``fed_recon``: the head reconstructed on each client's support data every round (stateless), evaluated by
  ReconEval on each client's test data (the head reconstructed on its support part, accuracy on its query part);
* ``furl_head``: a persistent private head with FURL's norm penalty (`furl_private_norm`);
* ``per_fedavg`` (first-order, as PFLlib) / ``per_fedavg_hf`` (Hessian-free): the global model, meta-learned
  (`fedpersonal.algorithms.per_fedavg`), ``per_fedavg_trains_per_round`` x ``client_epochs`` epochs a round (PFLlib's
  server trains a Per-FedAvg client twice a round); evaluated after one SGD step on the client's first train batch
  (PFLlib's ``evaluate_one_step``; PFLlib takes a random batch);
* ``pfedme``: the global model and each client's personalized theta, the model it is evaluated with
  (`fedpersonal.algorithms.pfedme`; PFLlib's pFedMeOptimizer weight decay mu = 0.001; server beta = 1).
* ``fedala``: each client's own model, the head (``layer_idx`` 2) aggregated element-wise with the global one at the
  start of its rounds (`fedpersonal.algorithms.fedala`); evaluated with that aggregation of its current weights W
  (PFLlib evaluates after one more epoch of W's learning);
* ``fedrod``: the body and a generic head (balanced softmax) global, a personal head local
  (`fedpersonal.algorithms.fedrod`); evaluated with the sum of both heads' logits.
* ``scaffold`` (not one of the leaderboard's 16 rows, run when named): the global model, every local step corrected
  by the control variates (`fedpersonal.algorithms.scaffold`), the uniform mean over clients as PFLlib's;
* ``moon`` (run when named): the global model, each client's batches with the model-contrastive loss against the
  global and its previous model (`fedpersonal.algorithms.moon`; ``--moon_mu``, ``--moon_tau``);
* ``feddbe`` (run when named): the global model with a representation bias per client between body and head,
  local (`fedpersonal.algorithms.feddbe`: its PRBM; PFLlib's default weight of its mean regularizer, 0).

The model is PFLlib's CNN (`image_classifiers.fedavg_cnn`) or the user's ``--model`` factory
(`fedpersonal.models.keras_factory`): the head (`image_classifiers.HEAD`) is the model's last layer (PFLlib's ``fc``),
the body (`image_classifiers.BODY`) its other layers with weights (`local_layer_names`).

FedBN (`fedpersonal.algorithms.fedbn`) is not a row: PFLlib's CNN has no batch normalization, on which FedBN is
FedAvg.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import models
from fedpersonal.algorithms import apfl
from fedpersonal.algorithms import ditto
from fedpersonal.algorithms import fed_recon
from fedpersonal.algorithms import fedala
from fedpersonal.algorithms import fedbabu
from fedpersonal.algorithms import feddbe
from fedpersonal.algorithms import fedper
from fedpersonal.algorithms import fedprox
from fedpersonal.algorithms import fedrep
from fedpersonal.algorithms import fedrod
from fedpersonal.algorithms import furl
from fedpersonal.algorithms import moon
from fedpersonal.algorithms import per_fedavg
from fedpersonal.algorithms import pfedme
from fedpersonal.algorithms import scaffold
from fedpersonal.core import client_plan
from fedpersonal.data import dataset_split
from fedpersonal.data import pfllib
from fedpersonal.models import image_classifiers
from fedpersonal.models import keras_factory
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


def _plain(config: PflBenchmarkConfig, mu: float) -> client_plan.ClientPlan:
    return fedprox.fedprox_plan(mu=mu, client_epochs=config.client_epochs, client_optimizer=sgd(config))


RECON_SPLIT = dataset_split.ReconstructionSplit()  # FedRecon's support/query halves of a client's data.


def _per_fedavg(config: PflBenchmarkConfig, *, hessian_free: bool) -> client_plan.ClientPlan:
    return per_fedavg.per_fedavg_plan(
        batch_size=config.batch_size,
        inner_learning_rate=config.client_learning_rate,
        outer_optimizer=sgd(config),  # PFLlib: beta = the learning rate.
        client_epochs=config.client_epochs * config.per_fedavg_trains_per_round,
        hessian_free=hessian_free,
    )


def _apfl(config: PflBenchmarkConfig) -> client_plan.ClientPlan:
    if config.apfl_variant == apfl.PFLLIB:
        return apfl.pfllib_plan(
            client_epochs=config.client_epochs,
            learning_rate=config.client_learning_rate,
            initial_alpha=config.apfl_alpha,
        )
    return apfl.apfl_plan(
        client_epochs=config.client_epochs,
        personal_epochs=config.personal_epochs,
        client_optimizer=sgd(config),
        personal_optimizer=sgd(config),
        initial_alpha=config.apfl_alpha,
    )


def _fedala(config: PflBenchmarkConfig) -> client_plan.ClientPlan:
    aggregation = fedala.AdaptiveLocalAggregation(
        layer_idx=config.fedala_layer_idx,
        eta=config.fedala_eta,
        rand_percent=config.fedala_rand_percent,
        batch_size=config.batch_size,
        threshold=config.fedala_threshold,
        num_pre_loss=config.fedala_num_pre_loss,
        max_epochs=config.fedala_max_epochs,
        seed=config.seed,
    )
    return fedala.fedala_plan(client_epochs=config.client_epochs, client_optimizer=sgd(config), aggregation=aggregation)


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


def fedrod_model_fn(
    data: pfllib.PfllibImageData, seed: int, model: str | None = None
) -> Callable[[], fedrod.FedRodModel]:
    """FedRoD's model of the benchmark's model: its last layer (the CNN's ``fc``) the generic head and, copied, the
    personal one."""
    return lambda: fedrod.FedRodModel(keras_model(data, seed, model), data.num_classes)


METHOD_SPECS: dict[str, Method] = {
    'fedavg': Method(lambda c: _plain(c, 0.0)),
    'fedprox': Method(lambda c: _plain(c, c.fedprox_mu)),
    'ditto': Method(
        lambda c: ditto.ditto_plan(
            lam=c.ditto_lambda,
            client_epochs=c.client_epochs,
            personal_epochs=c.personal_epochs,
            client_optimizer=sgd(c),
            personal_optimizer=sgd(c),
        )
    ),
    'apfl': Method(lambda c: _apfl(c)),
    'fedper': Method(
        lambda c: fedper.fedper_plan(client_epochs=c.client_epochs, client_optimizer=sgd(c)),
        image_classifiers.HEAD,
    ),
    'fedrep': Method(
        lambda c: fedrep.fedrep_plan(
            head_epochs=c.fedrep_head_epochs,
            body_epochs=c.client_epochs,
            head_optimizer=sgd(c),
            body_optimizer=sgd(c),
        ),
        image_classifiers.HEAD,
    ),
    # LG-FedAvg is FedPer's plan with the other layers local (`fedpersonal.algorithms.lg_fedavg`).
    'lg_fedavg': Method(
        lambda c: fedper.fedper_plan(client_epochs=c.client_epochs, client_optimizer=sgd(c)),
        image_classifiers.BODY,
    ),
    'fedavg_ft': Method(lambda c: _plain(c, 0.0), finetune=True),
    # The head kept (not 'initial'): no phase trains it, so it is every client's initial one, as the evaluation reads.
    'fedbabu': Method(
        lambda c: dataclasses.replace(
            fedbabu.fedbabu_plan(client_epochs=c.client_epochs, client_optimizer=sgd(c)),
            local_start=client_plan.KEPT,
        ),
        image_classifiers.HEAD,
        finetune=True,
    ),
    'fed_recon': Method(
        lambda c: fed_recon.fed_recon_plan(
            client_optimizer=sgd(c), reconstruction_optimizer=sgd(c), dataset_split=RECON_SPLIT
        ),
        image_classifiers.HEAD,
    ),
    'furl_head': Method(
        lambda c: furl.furl_plan(
            client_epochs=c.client_epochs, client_optimizer=sgd(c), private_norm_regularization=c.furl_private_norm
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
            mu=pfedme.PFLLIB_WEIGHT_DECAY,
        )
    ),
    'fedala': Method(_fedala),
    'fedrod': Method(
        lambda c: fedrod.fedrod_plan(client_epochs=c.client_epochs, client_optimizer=sgd(c)),
        image_classifiers.HEAD,
        phased_model=fedrod_model_fn,
    ),
    'scaffold': Method(
        lambda c: scaffold.scaffold_plan(client_learning_rate=c.client_learning_rate, client_epochs=c.client_epochs),
        client_weighting=tff.learning.ClientWeighting.UNIFORM,
    ),
    'moon': Method(
        lambda c: moon.moon_plan(client_optimizer=sgd(c), client_epochs=c.client_epochs, mu=c.moon_mu, tau=c.moon_tau)
    ),
    'feddbe': Method(
        lambda c: feddbe.feddbe_plan(client_epochs=c.client_epochs, client_optimizer=sgd(c)),
        (feddbe.LAYER_NAME,),
        keras_transform=feddbe.with_representation_bias,
    ),
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
