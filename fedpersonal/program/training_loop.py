"""A resumable federated training loop with per-round metrics and progress."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal.metrics import communication
from fedpersonal.program import outputs as outputs_lib

EvaluationFn = Callable[[Any], dict[str, Any]]


class ClientStatesLostError(ValueError):
    """A stateful run cannot resume: its client state store lacks the states of the checkpointed rounds."""


def sample_clients(client_ids: list[str], clients_per_round: int, round_num: int, seed: int) -> list[str]:
    """Deterministic uniform sample without replacement for `round_num`."""
    rng = np.random.default_rng([seed, round_num])
    size = min(clients_per_round, len(client_ids))
    return [client_ids[i] for i in rng.choice(len(client_ids), size=size, replace=False)]


def from_model_weights(weights: tff.learning.models.ModelWeights) -> list[np.ndarray]:
    """A private state as the flat array list stored per client (trainable, then non-trainable)."""
    return [np.asarray(v) for v in list(weights.trainable) + list(weights.non_trainable)]


def to_model_weights(arrays: list[np.ndarray], private_type: tff.Type) -> tff.learning.models.ModelWeights:
    """Inverse of `from_model_weights` for a process's `private_state_type`."""
    num_trainable = len(private_type.trainable)
    return tff.learning.models.ModelWeights(trainable=list(arrays[:num_trainable]), non_trainable=list(arrays[num_trainable:]))


def run_learning_process(
    process: tff.learning.templates.LearningProcess,
    *,
    client_data: tff.simulation.datasets.ClientData,
    dataset_fn: Callable[[tf.data.Dataset], tf.data.Dataset],
    clients_per_round: int,
    total_rounds: int,
    outputs: outputs_lib.ExperimentOutputs,
    seed: int = 0,
    evaluation_fn: Optional[EvaluationFn] = None,
    rounds_per_evaluation: int = 10,
    rounds_per_checkpoint: int = 10,
    name: str = 'train',
    initial_state: Any = None,
    validate_fn: Optional[Callable[[str, tf.data.Dataset], None]] = None,
    client_state_store: Any = None,
) -> tuple[Any, list[dict[str, float]]]:
    """Runs `total_rounds` rounds, resuming from the latest checkpoint if any.

    Each round samples `clients_per_round` clients (deterministic in `seed` and
    the round number, so a resumed run samples the same clients), builds their
    datasets with `dataset_fn`, runs `process.next`, and releases the round's
    metrics (plus `round_seconds`, and `evaluation_fn(model_weights)` every
    `rounds_per_evaluation` rounds and after the last) to `outputs`.

    Args:
      process: The learning process.
      client_data: Training clients.
      dataset_fn: Maps a client's raw dataset to the batched model input.
      clients_per_round: Clients sampled per round.
      total_rounds: Rounds to run in total (including resumed ones).
      outputs: Where metrics and checkpoints go.
      seed: Client-sampling seed.
      evaluation_fn: Optional `model_weights -> metrics` (e.g. ReconEval on
        validation clients).
      rounds_per_evaluation: Evaluation period.
      rounds_per_checkpoint: Checkpoint period (the last round is always saved).
      name: Shown in progress lines.
      initial_state: State to start from instead of `process.initialize()`.
      validate_fn: Called as `validate_fn(client_id, dataset)` for each sampled
        client before the round (e.g. an input-spec check naming the client).
      client_state_store: For stateful algorithms (FURL): a
        `fedpersonal.client_state.ClientStateStore` holding each client's private
        state. The sampled clients' states are passed to `process.next` as its
        CLIENTS-placed third argument and the returned ones written back; the
        store is committed right after each server checkpoint and rolled back to
        the checkpointed round on resume, so both always agree.

    Raises:
      ClientStatesLostError: On resume from a checkpoint of round R when
        `client_state_store` has committed only up to a round < R (e.g. a fresh
        in-memory store): continuing would silently pair the checkpointed server
        state with initial client states.

    Returns:
      `(final_state, history)`: the state and the released metric rows.
    """
    state = initial_state if initial_state is not None else process.initialize()
    start_round = 0
    loaded, version = asyncio.run(outputs.state_manager.load_latest(state))
    if loaded is not None:
        state, start_round = loaded, int(version)
        logging.info('[%s] resumed from checkpoint at round %d', name, start_round)
    if client_state_store is not None:
        committed = client_state_store.committed_round()
        if committed < start_round:
            raise ClientStatesLostError(
                f'[{name}] cannot resume from the server checkpoint of round {start_round} in '
                f'{outputs.path("checkpoints")}: the client state store has no private client states committed '
                f'after round {committed}, so the clients would continue from stale or initial states (an '
                f'in-memory store does not outlive its process). Use a persistent store (e.g. --state_store=sqlite) '
                f'to make stateful runs resumable, or delete the checkpoints to start over.')
        client_state_store.rollback(start_round)
    client_ids = list(client_data.client_ids)
    history = []
    started = time.time()
    for round_num in range(start_round + 1, total_rounds + 1):
        round_start = time.time()
        sampled = sample_clients(client_ids, clients_per_round, round_num, seed)
        datasets = []
        for client_id in sampled:
            dataset = dataset_fn(client_data.create_tf_dataset_for_client(client_id))
            if validate_fn is not None:
                validate_fn(client_id, dataset)
            datasets.append(dataset)
        if client_state_store is None:
            result = process.next(state, datasets)
        else:
            private = [to_model_weights(s, process.private_state_type) for s in client_state_store.get(sampled)]
            result = process.next(state, datasets, private)
            client_state_store.put(sampled, [from_model_weights(p) for p in result.private_states], round_num)
        state = result.state
        metrics = {'train': result.metrics.get('client_work', {}).get('train', {})}
        measured = communication.communication_from_metrics(result.metrics)
        if measured:
            metrics['communication'] = measured
        metrics['round_seconds'] = time.time() - round_start
        if evaluation_fn is not None and (round_num % rounds_per_evaluation == 0 or round_num == total_rounds):
            metrics['eval'] = evaluation_fn(process.get_model_weights(state))
        history.append(outputs.release_metrics(round_num, metrics))
        if round_num % rounds_per_checkpoint == 0 or round_num == total_rounds:
            asyncio.run(outputs.state_manager.save(state, round_num))
            if client_state_store is not None:
                client_state_store.commit(round_num)
        done = round_num - start_round
        eta = (time.time() - started) / done * (total_rounds - round_num)
        shown = {k: v for k, v in history[-1].items() if k in ('train/loss', 'eval/rmse', 'eval/accuracy', 'eval/per_client/rmse/p50')}
        logging.info(
            '[%s] round %d/%d  %.2fs  eta %.0fs  %s',
            name, round_num, total_rounds, metrics['round_seconds'], eta,
            '  '.join(f'{k}={v:.4f}' for k, v in shown.items()),
        )
    return state, history
