"""FedALA (Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated Learning", AAAI 2023).

Each client keeps the model it trained last. At the start of its round it does not overwrite that model with the
received global one; it aggregates the two element-wise: the lower layers take the global weights, and the top
layers (the last `layer_idx` trainable tensors) start at ``local + (global - local) * W``, with weights W in
[0, 1] per element, learned on a random `rand_percent`% of its training data by projected SGD (until the loss
settles the first time, one pass later). Then it trains that model as FedAvg does, uploads it, and keeps it; the
server averages (FedAvg). W and the model never leave the client. A client predicts with its aggregated start.

As PFLlib (``system/utils/ALA.py``, ``clientala.py``; defaults eta = 1, rand_percent = 80, layer_idx = 2, threshold
0.1 over the last 10 losses), with two differences: the first learning stops after `max_epochs` epochs (PFLlib's
has no limit), and the slice's start is drawn from a seed and the client's count of aggregations (reproducible).

The client work is a `ClientPlan` whose global phase starts from the aggregation
(`fedpersonal.core.local_aggregation`, its rules defined once), run by every backend: per client over its dataset,
and on the grouped engine client after client over its packed examples (`fedpersonal.simulation.ala_engine`), since
each client learns W for as many epochs as its own losses decide.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal import backends
from fedpersonal.core import client_plan
from fedpersonal.core import local_aggregation
from fedpersonal.core import process as process_lib

PFLLIB_DEFAULTS = local_aggregation.AdaptiveLocalAggregation()


def fedala_plan(
    *,
    client_epochs: int,
    client_optimizer: tff.learning.optimizers.Optimizer,
    aggregation: local_aggregation.AdaptiveLocalAggregation,
) -> client_plan.ClientPlan:
    """FedALA's client work: the adaptive local aggregation, then local training of the aggregated model."""
    phase = client_plan.Phase((client_plan.GLOBAL,), client_epochs, client_optimizer)
    return client_plan.ClientPlan((phase,), personal_copy=True, local_aggregation=aggregation)


def build_fedala(
    model_fn: Callable[[], tf.keras.Model],
    *,
    element_spec: object,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: tff.learning.optimizers.Optimizer,
    client_epochs: int = 1,
    aggregation: local_aggregation.AdaptiveLocalAggregation = PFLLIB_DEFAULTS,
) -> process_lib.PersonalizedProcess:
    """Builds FedALA on the context's backend, for a Keras classifier (logits).

    Args:
      model_fn: No-arg function returning a new Keras classifier (logits) on `element_spec['x']`.
      element_spec: The client datasets' element spec, with ``x`` and ``y`` (integer labels).
      client_optimizer: The local optimizer (fresh state every round; PFLlib: SGD).
      server_optimizer: Applied to the averaged update.
      client_epochs: Local epochs per round.
      aggregation: The aggregation's hyperparameters (default PFLlib's, batch 10; set its `batch_size` to the
        clients').

    Returns:
      A stateful `PersonalizedProcess` whose private state is the client's model with W after its trainable
      weights and its count of aggregations after its non-trainable ones
      (`client_plan.personalized_weights` gives the model it predicts with).

    Example:

    >>> import collections
    >>> spec = collections.OrderedDict(x=tf.TensorSpec([None, 4], tf.float32), y=tf.TensorSpec([None], tf.int32))
    >>> process = build_fedala(lambda: tf.keras.Sequential([tf.keras.Input([4]), tf.keras.layers.Dense(3)]),
    ...     element_spec=spec, client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
    ...     server_optimizer=tff.learning.optimizers.build_sgdm(1.0))
    >>> private = process.initial_private_state()
    >>> [w.shape for w in private.trainable], private.non_trainable
    ([(4, 3), (3,), (4, 3), (3,)], [0])
    """
    plan = fedala_plan(client_epochs=client_epochs, client_optimizer=client_optimizer, aggregation=aggregation)
    return backends.build_classifier_process(
        plan, model_fn, element_spec=element_spec, server_optimizer=server_optimizer, name='FedALA'
    )
