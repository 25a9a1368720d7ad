"""The structures HPFL and its baselines exchange: client data and state, reports, uploads, server state."""

from __future__ import annotations

from typing import Any
from typing import NamedTuple

import numpy as np
import tensorflow_federated as tff

from fedpersonal import errors
from fedpersonal.models import gum

CENTER_WEIGHTINGS = ('distance', 'inverse_distance')
ROW_UPDATES = ('lazy', 'dense')
SPLITS = {'train': 0, 'validation': 1, 'test': 2}

ModelWeights = tff.learning.models.ModelWeights


class HpflDataError(errors.DataError):
    """Client data that cannot feed a GUM (the message names the data set, the client and the field)."""


class ClientData(NamedTuple):
    """What one silo holds besides its model: its data.

    Attributes:
      train: `tf.data.Dataset` of batches ``OrderedDict(user=int64[B], item=int64[B], label=float32[B])``, labels
        on the [0, 1] scale (`gum.to_unit`).
      validation: Same, the validation split.
      item_attributes: float32 ``[max_items, K]`` multi-hot attribute rows (zero rows past the silo's items).
      seed: int64 scalar, distinct per silo (used by the noised baselines).
    """

    train: Any
    validation: Any
    item_attributes: Any
    seed: Any


class ClientState(NamedTuple):
    """A client's private state: its personalized GUM and the real sizes of its padded tables."""

    model: gum.GumWeights
    num_users: Any  # int32 scalar
    num_items: Any  # int32 scalar


class ClientReport(NamedTuple):
    """What a client learns in its upload phase (only parts of it are uploaded, see `fedpersonal.algorithms.hpfl`)."""

    public: gum.PublicWeights  # Trained public components c_ki.
    attribute_accuracy: Any  # [K] Acc_ki on the validation split (0 without validation records of attribute k).
    attribute_iterations: Any  # [K] I_ki.
    accuracy: Any  # Acc_i.
    train_loss_sum: Any
    num_train_examples: Any
    validation_loss_sum: Any
    validation_correct: Any
    num_validation_examples: Any


class Centres(NamedTuple):
    """A client's k-means centres of its user embeddings and item difficulties, padded with masks."""

    user_centres: Any  # [max_local_clusters, K]
    user_mask: Any  # [max_local_clusters] float32 1/0
    item_centres: Any
    item_mask: Any


class GlobalCentres(NamedTuple):
    """The server's global centres Theta^g of the clustered private aggregation (masked out when unused)."""

    user_centres: Any  # [max_global_clusters, K]
    user_mask: Any
    item_centres: Any
    item_mask: Any


class GlobalComponents(NamedTuple):
    """What the server broadcasts for HPFL's client update phase: c^g and the global centres Theta^g."""

    public: gum.PublicWeights
    user_centres: Any  # [max_global_clusters, K]
    user_mask: Any
    item_centres: Any
    item_mask: Any


class ServerState(NamedTuple):
    """The state of the family's server step: the ``aggregator`` of the process state.

    The process state is TFF's ``LearningAlgorithmState`` (`fedpersonal.core.compose_personalized_process`):
    ``global_model_weights`` are the global public components as ``ModelWeights(trainable=[skill_W, know_W,
    relative_M], non_trainable=[])`` (for HPFL c^g, which keeps its initial value without public aggregation; for
    the FedAvg family the server model), ``distributor`` is the int32 number of rounds run, ``aggregator`` this.

    Attributes:
      centres: The global centres Theta^g (all masked out without clustered private aggregation).
      aggregation: State of the public sum's or the update aggregation's `tff.aggregators` process, else ``()``.
      finalizer: State of TFF's apply-optimizer finalizer (update aggregations), else ``()``.
    """

    centres: Any
    aggregation: Any
    finalizer: Any


def global_components(state: Any) -> GlobalComponents:
    """c^g and Theta^g of a process state (Python values, not inside a computation)."""
    return GlobalComponents(gum.PublicWeights(*state.global_model_weights.trainable), *state.aggregator.centres)


class SiloPredictions(NamedTuple):
    """Predictions of one silo on one split, in record order, on the original label scale."""

    client_id: str
    user: np.ndarray
    item: np.ndarray
    label: np.ndarray
    prediction: np.ndarray
