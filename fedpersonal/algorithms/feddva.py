"""FedDVA: the federated dual variational autoencoder (Yan et al., "Personalization Disentanglement for FL").

Only the two encoders (z and c, with the c-encoder's embeddings) are federated: they are broadcast, trained on
each sampled client and averaged (FedAvg with a server optimizer, plain averaging by default). Each client's
decoder, classifier head and every batch-norm statistic are its *private state*: a `tff.CLIENTS`-placed input and
output of the round, kept between rounds in a `fedpersonal.client_state` store, never reaching a SERVER intrinsic
(as in `fedpersonal.algorithms.furl`).

A client round (fresh Adam for every phase of every round, as in the authors' code):

1. `decoder_epochs` epochs on the reconstruction loss, stepping only the decoder;
2. `z_epochs` epochs on reconstruction + KL(q(z|x) || N(0, I)), stepping only the z-encoder;
3. `c_epochs` epochs on reconstruction + the c regularizers, stepping only the c-encoder (and its embeddings);
4. optionally `head_epochs` epochs of the classifier head on [mu_z, mu_c] (a personalized head; the encoders step
   too when the model's ``head_tunes_encoders`` is set, and their change is part of the averaged update).

See `fedpersonal.models.feddva_models` for the losses. The client work is a
`fedpersonal.core.client_plan.ClientPlan` of the model's own phase losses and variable groups
(`fedpersonal.core.model_loss_plan`; the private state also counts the client's participations, which seed its
reparameterization noise), run by every backend (`fedpersonal.backends`; by default the grouped engine, equal to
the per-client backend to float precision). The process has FURL's signature:

    next: (<state@SERVER, {data}@CLIENTS, {private}@CLIENTS> -> <state@SERVER, metrics@SERVER, {private}@CLIENTS>)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.core import client_plan
from fedpersonal.core import client_work
from fedpersonal.core import process as process_lib
from fedpersonal.models import feddva_models


def set_weights(model: feddva_models.DualVae, global_state: Any, private_state: Any) -> None:
    """Assigns federated and private weights (eagerly or in a `tf.function`)."""
    client_work.assign(model.global_trainable, global_state.trainable)
    client_work.assign(model.private_trainable, private_state.trainable)
    client_work.assign(model.private_non_trainable, private_state.non_trainable)


def feddva_plan(
    *,
    decoder_epochs: int,
    z_epochs: int,
    c_epochs: int,
    head_epochs: int,
    optimizer: tff.learning.optimizers.Optimizer,
    head_optimizer: tff.learning.optimizers.Optimizer,
) -> client_plan.ClientPlan:
    """FedDVA's client work: its four phases (a phase of 0 epochs is skipped), each on the `DualVae`'s loss and
    variables of that name with a fresh optimizer; the head phase also reports its accuracy after each step."""
    epochs = dict(decoder=decoder_epochs, z=z_epochs, c=c_epochs, head=head_epochs)
    phases = tuple(
        client_plan.Phase(
            (name,),
            epochs[name],
            head_optimizer if name == 'head' else optimizer,
            loss=name,
            statistic='accuracy' if name == 'head' else None,
        )
        for name in feddva_models.PHASES
    )
    return client_plan.ClientPlan(phases, counts_participations=True)


def build_feddva(
    model_fn: Callable[[], feddva_models.DualVae],
    *,
    element_spec: Any,
    decoder_epochs: int = 1,
    z_epochs: int = 1,
    c_epochs: int = 1,
    head_epochs: int = 0,
    learning_rate: float = 1e-3,
    head_learning_rate: float = 1e-2,
    server_optimizer: tff.learning.optimizers.Optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    client_weighting: Any = tff.learning.ClientWeighting.NUM_EXAMPLES,
    simulation: str | None = None,
    group_size: int | None = None,
) -> process_lib.PersonalizedProcess:
    """Builds the FedDVA iterative process.

    Args:
      model_fn: No-arg function returning a new `DualVae` (its variables at their initializers).
      element_spec: The client datasets' element spec: `OrderedDict(x=[None, h, w, c] float32, y=[None] int32)`.
      decoder_epochs: Epochs of phase 1 per round.
      z_epochs: Epochs of phase 2 per round.
      c_epochs: Epochs of phase 3 per round.
      head_epochs: Epochs of the personalized classifier head per round (0: no head training).
      learning_rate: Adam learning rate of phases 1-3 (the paper: 1e-3); Adam is re-initialized every phase.
      head_learning_rate: Adam learning rate of the head phase (head, and encoders if the model tunes them).
      server_optimizer: Applied to the averaged encoder update (SGD 1.0: FedAvg).
      client_weighting: `NUM_EXAMPLES` or `UNIFORM`.
      simulation: An override of the context's backend (`fedpersonal.backends.use`, the one chooser) for this
        builder alone: ``'engine'`` or ``'per_client'``; None (default) follows the context. Same results to float precision. The engine materializes each client's
        phases by iterating its dataset once per phase (as the per-client backend does), once per client id: a
        dataset must give the same batches every round (a fresh `tf.data` pipeline per round with a seeded
        shuffle does).
      group_size: Engine only: the most logical clients per group (default: as many as fit 1 GiB).

    Returns:
      A stateful `fedpersonal.core.PersonalizedProcess` (private state: decoder + head + batch-norm statistics +
      the participation counter).

    Example:

    >>> import collections
    >>> import tensorflow as tf
    >>> from fedpersonal import algorithms
    >>> from fedpersonal.models import feddva_models
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 28, 28, 1], tf.float32),
    ...                                y=tf.TensorSpec([None], tf.int32))
    >>> process = algorithms.build_feddva(lambda: feddva_models.DualVae(feddva_models.SCALED), element_spec=spec)
    >>> process.stateful
    True
    """
    for name, value in (
        ('decoder_epochs', decoder_epochs),
        ('z_epochs', z_epochs),
        ('c_epochs', c_epochs),
        ('head_epochs', head_epochs),
    ):
        if value < 0:
            raise ValueError(f'{name} must be >= 0, got {value}')
    if client_weighting not in (tff.learning.ClientWeighting.NUM_EXAMPLES, tff.learning.ClientWeighting.UNIFORM):
        raise ValueError('client_weighting must be NUM_EXAMPLES or UNIFORM')

    plan = feddva_plan(
        decoder_epochs=decoder_epochs,
        z_epochs=z_epochs,
        c_epochs=c_epochs,
        head_epochs=head_epochs,
        optimizer=tff.learning.optimizers.build_adam(learning_rate=learning_rate),
        head_optimizer=tff.learning.optimizers.build_adam(learning_rate=head_learning_rate),
    )
    with backends.use(simulation or backends.current()):
        return backends.build_process(
            plan,
            model_fn,
            element_spec=element_spec,
            server_optimizer=server_optimizer,
            client_weighting=client_weighting,
            group_size=group_size,
            name='FedDVA',
        )
