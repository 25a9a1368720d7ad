"""Every silo's predictions with its own (personalized) client state, computed where its data is."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedpersonal.algorithms.hpfl import data as data_lib
from fedpersonal.algorithms.hpfl.types import SPLITS
from fedpersonal.algorithms.hpfl.types import ClientState
from fedpersonal.algorithms.hpfl.types import SiloPredictions
from fedpersonal.models import gum


@functools.lru_cache(maxsize=8)
def _prediction_computation(config: gum.GumConfig):
    state_type = data_lib.client_state_type(config)
    eval_type = tff.to_type(
        (tff.SequenceType(data_lib.batch_type()), tff.TensorType(np.float32, [config.max_items, config.num_attributes]))
    )

    @tff.tensorflow.computation(state_type, eval_type)
    def predict_client(state, data):
        dataset, attributes = data

        def step(predictions, batch):
            prediction = gum.predict(state.model, batch['user'], batch['item'], tf.gather(attributes, batch['item']))
            return tf.concat([predictions, prediction], 0)

        return dataset.reduce(tf.zeros([0]), step)

    @tff.federated_computation(tff.FederatedType(state_type, tff.CLIENTS), tff.FederatedType(eval_type, tff.CLIENTS))
    def predict_all(states, data):
        return tff.federated_map(predict_client, (states, data))

    return predict_all


def predict_silos(
    config: gum.GumConfig,
    client_states: Sequence[ClientState],
    data: Any,
    *,
    split: str = 'test',
    batch_size: int = 256,
) -> list[SiloPredictions]:
    """Every silo's predictions on one split with its own client state (each silo computes on its own data).

    Args:
      config: The model config.
      client_states: One `ClientState` per silo of `data`, in silo order.
      data: The `UserModelingData`.
      split: 'train', 'validation' or 'test'.
      batch_size: Evaluation batch size.

    Returns:
      One `SiloPredictions` per silo, on the original label scale (ratings mapped back with `gum.from_unit`).
    """
    if len(client_states) != len(data.silos):
        raise ValueError(f'{data.name}: {len(client_states)} client states for {len(data.silos)} silos.')
    inputs = []
    for silo in data.silos:
        data_lib.check_silo(silo, config, data.name)
        inputs.append(
            (
                data_lib.split_dataset(silo, config, split, batch_size=batch_size),
                data_lib.padded_attributes(silo, config),
            )
        )
    outputs = _prediction_computation(config)(list(client_states), inputs)
    results = []
    for silo, prediction in zip(data.silos, outputs):
        keep = np.asarray(silo.split) == SPLITS[split]
        results.append(
            SiloPredictions(
                client_id=silo.client_id,
                user=np.asarray(silo.user)[keep],
                item=np.asarray(silo.item)[keep],
                label=np.asarray(silo.label, np.float32)[keep],
                prediction=np.asarray(
                    gum.from_unit(np.asarray(prediction, np.float32), config.rating_range), np.float32
                ),
            )
        )
    return results
