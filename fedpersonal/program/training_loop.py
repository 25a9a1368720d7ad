"""The one training loop of every binary: resumable rounds, client states, metrics, model selection, progress.

`run_learning_process(process, ...)` runs a `fedpersonal.core.PersonalizedProcess` (or a TFF `LearningProcess`)
for ``total_rounds`` rounds and owns, once for every binary:

* **participation**: either *sampled* clients (``client_data`` a `tff.simulation.datasets.ClientData`:
  ``clients_per_round`` clients per round, deterministic in the seed and the round number, so a resumed run
  samples the same clients; the next round's sample is known, so a process that can prefetches it while the round
  computes, `PersonalizedProcess.prefetch`) or *every client every round* (cross-silo, e.g. HPFL: ``client_data`` a sequence or a
  mapping ``{client_id: input}``; all clients participate in every round, in that order);
* **private client states** of a stateful process, of any nested structure (`tf.nest`; e.g. FURL's
  `ModelWeights`, HPFL's `ClientState` with int32 scalars): flattened to the list of numpy arrays a
  `fedpersonal.client_state` store keeps per client (`flatten_private_state`) and packed back against the
  process's `initial_private_state()` (`unflatten_private_state`);
* **checkpoints**: the server state (`tff.program.FileProgramStateManager`) every ``rounds_per_checkpoint``
  rounds and after the last, written atomically together with a commit of the client state store (`Checkpoints`:
  staged, committed, then published), so a run killed at any moment restarts from a server state and client states
  of the same round; on restart with the same output directory the run resumes from the latest checkpoint (the
  store is rolled back to it; `ClientStatesLostError` if it lost the checkpointed rounds) and ends with the numbers
  of an uninterrupted run; a damaged or partial newest checkpoint (each carries a manifest of its files' sizes and
  checksums) is logged and moved aside, and the newest intact one is used, or a stateful run whose store is ahead
  of it stops with `DamagedCheckpointError` (`Checkpoints.load_latest`);
* **the config guard** (``config``): the run's configuration is recorded next to its checkpoints at a fresh start
  and a resume under another configuration is refused (`ConfigMismatchError`);
* **metrics**: every round's metrics (plus ``round_seconds`` and, every ``rounds_per_evaluation`` rounds and after
  the last, the evaluation) go to ``metrics.csv`` and TensorBoard (`ExperimentOutputs.release_metrics`); how the
  engine ran the rounds (`PersonalizedProcess.engine_strategy`) to ``engine_strategy.json``, once it is known;
* **model selection** (``selection``): the private states of the evaluation round with the lowest validation
  metric are kept in the store (ids ``'best/<client id>'``) and the best round and value in the checkpoint;
* **early stopping** (``stopping``): the server state of the best evaluation round is kept in the checkpoint and
  the run ends after ``patience`` evaluations without improvement (`fedpersonal.program.selection`);
* **non-finite losses** (``non_finite_clients``): a round whose training loss is NaN or infinite is diagnosed by
  rerunning each of its clients alone from the round's starting state; ``'stop'`` (the default) raises
  `NonFiniteLossError` naming the round and the clients before anything of that round is checkpointed, ``'zero'``
  keeps going (the client work already zeroes a non-finite update and keeps the client's previous private state,
  as TFF's zeroing aggregators do) and counts them in ``train/non_finite_clients``;
* **one run per output directory**: the loop holds the lock of ``outputs.directory`` (`output_dir.lock`); another
  process running on it is refused with `OutputDirectoryInUseError`; a read-only or full directory stops the run
  with `OutputDirectoryNotWritableError` naming it, its published checkpoints intact;
* **SIGINT and SIGTERM** stop the run cleanly: the round in flight is finished and checkpointed, then
  `KeyboardInterrupt` (SIGINT) or `SystemExit(143)` (SIGTERM) is raised (`stop_signals`);
* **progress**: a log line with the round's time, the ETA (training and evaluation time per round measured
  separately) and the headline metrics for the first round, every evaluation round, the last round and otherwise
  at most one round every `progress.ROUND_LINE_SECONDS` (`progress.should_log_round`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from absl import logging

from fedpersonal import errors
from fedpersonal import faults
from fedpersonal import progress
from fedpersonal import wording
from fedpersonal.core.process import LazyDatasets
from fedpersonal.metrics import communication
from fedpersonal.program import output_dir
from fedpersonal.program import outputs as outputs_lib
from fedpersonal.program import stop_signals
from fedpersonal.program.checkpoints import Checkpoints
from fedpersonal.program.non_finite import NON_FINITE_MODES
from fedpersonal.program.non_finite import NonFiniteLossError
from fedpersonal.program.non_finite import non_finite_losses
from fedpersonal.program.participation import participation as _participation
from fedpersonal.program.participation import sample_clients
from fedpersonal.program.participation import surviving_clients
from fedpersonal.program.run_record import RUN_CONFIG_FILE
from fedpersonal.program.run_record import ConfigMismatchError
from fedpersonal.program.selection import EarlyStopping
from fedpersonal.program.selection import ModelSelection

ENGINE_STRATEGY_FILE = 'engine_strategy.json'

EvaluationFn = Callable[[Any], dict[str, Any]]
ClientEvaluationFn = Callable[[Any, list[Any]], dict[str, Any]]
_DEFAULT_LOG_KEYS = ('train/loss', 'eval/rmse', 'eval/accuracy', 'eval/per_client/rmse/p50')


class TooManyClientsPerRoundError(errors.ConfigError):
    """``clients_per_round`` is larger than the number of training clients."""


class ClientStatesLostError(errors.InputError):
    """A stateful run cannot resume: its client state store lacks the states of the checkpointed rounds."""


# ------------------------------------------------------------------------------------------- private states
def flatten_private_state(state: Any) -> list[np.ndarray]:
    """A private state of any nested structure as the flat array list a client state store keeps (`tf.nest`
    order: for `ModelWeights` trainable, then non-trainable)."""
    return [np.asarray(v) for v in tf.nest.flatten(state)]


def unflatten_private_state(arrays: Sequence[Any], template: Any) -> Any:
    """Inverse of `flatten_private_state`: the arrays packed into the structure of `template`."""
    return tf.nest.pack_sequence_as(template, list(arrays))


def private_state_template(process: Any) -> Any:
    """A private state of `process` giving the structure to unflatten stored states into: its
    `initial_private_state()` (a `PersonalizedProcess`), else `ModelWeights` of its `private_state_type`."""
    if callable(getattr(process, 'initial_private_state', None)):
        return process.initial_private_state()
    private_type = process.private_state_type
    return to_model_weights([None] * (len(private_type.trainable) + len(private_type.non_trainable)), private_type)


def from_model_weights(weights: tff.learning.models.ModelWeights) -> list[np.ndarray]:
    """A `ModelWeights` private state as the flat array list stored per client (trainable, then non-trainable)."""
    return [np.asarray(v) for v in list(weights.trainable) + list(weights.non_trainable)]


def to_model_weights(arrays: list[Any], private_type: tff.Type) -> tff.learning.models.ModelWeights:
    """Inverse of `from_model_weights` for a process's `private_state_type`."""
    num_trainable = len(private_type.trainable)
    return tff.learning.models.ModelWeights(
        trainable=list(arrays[:num_trainable]), non_trainable=list(arrays[num_trainable:])
    )


# ---------------------------------------------------------------------------------------------- config guard
def _jsonable(config: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(outputs_lib._to_jsonable(dict(config))))  # pylint: disable=protected-access


def guard_config(path: str, config: Mapping[str, Any], *, resuming: bool = True) -> None:
    """Records `config` in the JSON file `path` or, when `resuming` and a record exists, checks it is the same.

    A fresh start (``resuming=False``) overwrites any record (e.g. of a run killed before its first checkpoint).

    Raises:
      ConfigMismatchError: The recorded configuration differs (naming the differing fields).
    """
    current = _jsonable(config)
    if resuming and os.path.exists(path):
        with open(path) as f:
            recorded = json.load(f)
        changed = sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))
        if changed:
            shown = ', '.join(f'{k}: {recorded.get(k)!r} -> {current.get(k)!r}' for k in changed)
            raise ConfigMismatchError(
                f'{os.path.dirname(os.path.abspath(path))} holds the outputs of a run with another configuration '
                f'({shown}); use another output directory, restore the configuration, or delete the directory to '
                f'start over.'
            )
        return
    outputs_lib.write_json(path, current)


# ------------------------------------------------------------------------------------------------- the loop
def _train_metrics(metrics: Any, train_metrics_fn: Callable[[Any], Any] | None) -> Any:
    if train_metrics_fn is not None:
        return train_metrics_fn(metrics)
    return metrics.get('client_work', {}).get('train', {})


def _holding_the_output_lock(run: Callable[..., Any]) -> Callable[..., Any]:
    """`run` with the lock of its ``outputs`` directory held (`output_dir.lock`: one run per directory) and SIGINT
    and SIGTERM deferred to the end of the round (`stop_signals`)."""

    @functools.wraps(run)
    def locked(process: Any, **options: Any) -> Any:
        with output_dir.lock(options['outputs'].directory), stop_signals.deferred():
            return run(process, **options)

    return locked


@_holding_the_output_lock
def run_learning_process(
    process: Any,
    *,
    client_data: Any,
    total_rounds: int,
    outputs: outputs_lib.ExperimentOutputs,
    dataset_fn: Callable[[Any], Any] | None = None,
    round_dataset_fn: Callable[[str, Any, int], Any] | None = None,
    clients_per_round: int | None = None,
    seed: int = 0,
    evaluation_fn: EvaluationFn | None = None,
    client_evaluation_fn: ClientEvaluationFn | None = None,
    rounds_per_evaluation: int = 10,
    rounds_per_checkpoint: int = 10,
    name: str = 'train',
    initial_state: Any = None,
    validate_fn: Callable[[str, Any], None] | None = None,
    client_state_store: Any = None,
    selection: ModelSelection | None = None,
    stopping: EarlyStopping | None = None,
    train_metrics_fn: Callable[[Any], Any] | None = None,
    evaluation_name: str = 'eval',
    config: Mapping[str, Any] | None = None,
    log_keys: Sequence[str] | None = None,
    non_finite_clients: str = 'stop',
    dropout_rate: float = 0.0,
    overselection: float = 1.0,
    round_metrics_fn: Callable[[int, Any], Mapping[str, Any]] | None = None,
) -> tuple[Any, list[dict[str, float]]]:
    """Runs `total_rounds` rounds, resuming from the latest checkpoint if any (see the module docstring).

    Args:
      process: A `PersonalizedProcess` (or a TFF `LearningProcess`): ``next`` returns ``state`` and ``metrics``
        (and, stateful, ``private_states``).
      client_data: A `tff.simulation.datasets.ClientData` (sampled participation), or a sequence (client ids
        ``'0'``, ``'1'``, ...) or mapping ``{client_id: input}`` of every client's input to ``next`` (every client
        participates in every round, in this order).
      total_rounds: Rounds to run in total (including resumed ones).
      outputs: Where metrics and checkpoints go.
      dataset_fn: Maps a client's raw dataset (or input) to what ``next`` takes (default: as is).
      round_dataset_fn: For inputs that change every round (e.g. a new order of a client's examples each round):
        ``(client_id, input after dataset_fn, round number) -> the round's input``. The round's clients are then
        read afresh every round (no client is packed once for all rounds, none prefetched); engine workers, which
        load their clients by id, cannot run them.
      clients_per_round: Clients sampled per round (sampled participation only).
      seed: Client-sampling seed.
      evaluation_fn: Optional ``model_weights -> metrics`` (e.g. ReconEval on validation clients).
      client_evaluation_fn: Optional ``(model_weights, private_states) -> metrics`` for every-client runs of a
        stateful process: the round's new private states of every client, in client order (e.g. each silo
        evaluating its personalized model).
      rounds_per_evaluation: Evaluation period (and after the last round).
      rounds_per_checkpoint: Checkpoint period (the last round is always saved).
      name: Shown in progress lines.
      initial_state: State to start from instead of `process.initialize()`.
      validate_fn: Called as `validate_fn(client_id, input)` the first time a client's input is built (e.g. an
        input-spec check naming the client).
      client_state_store: For stateful processes: a `fedpersonal.client_state.ClientStateStore` holding each
        client's flat private state (`flatten_private_state`). The participants' states are passed to
        ``next`` as its CLIENTS-placed third argument and the returned ones written back; the store is committed
        right after each server checkpoint and rolled back to the checkpointed round on resume.
      selection: Optional `ModelSelection` (every-client runs with a store and an evaluation), updated in place.
      stopping: Optional `EarlyStopping` on an evaluation metric (needs an evaluation), updated in place: the run
        ends after its `patience` stale evaluations (checkpointed, so a resumed run stops at the same round) and
        keeps the best evaluation round's server state (`stopping.best_state`) and, with its
        ``keep_client_states``, every client's private state of that round in `client_state_store`
        (`stopping.best_client_states`).
      train_metrics_fn: Maps the round's ``metrics`` to what is released under ``train`` (default: the client
        work's ``train`` metrics).
      evaluation_name: The key the evaluation metrics are released under.
      config: Optional JSON-able configuration of the run (the config guard).
      log_keys: Flat metric keys shown in the progress lines.
      non_finite_clients: What a round with a non-finite training loss does: ``'stop'`` raises
        `NonFiniteLossError` (naming the round and the clients whose loss is non-finite, found by rerunning each
        participant alone; nothing of that round is checkpointed, so a resume with other settings can continue),
        ``'zero'`` goes on with those clients' updates zeroed (as the client work does for any non-finite update)
        and counts them in ``train/non_finite_clients``.
      dropout_rate: Simulated failures (sampled participation): each sampled client drops out (or times out) with
        this probability, seeded by ``(seed, round)``; a dropped client contributes nothing and its private state
        stays as it was. Reported per round as ``participation/sampled``, ``participation/dropped`` and
        ``participation/clients``; a round where every client dropped leaves the state unchanged.
      overselection: Sample ``ceil(overselection * clients_per_round)`` clients and use the first
        `clients_per_round` that report (the FedRecon paper's deployment practice against dropouts).
      round_metrics_fn: Optional ``(round_num, the round's metrics from next) -> metrics`` released with the
        round's (e.g. `fedpersonal.privacy.dp.DifferentialPrivacy.round_metrics`: ``privacy/epsilon``).

    Raises:
      ClientStatesLostError: On resume from a checkpoint of round R when `client_state_store` has committed only up
        to a round < R (e.g. a fresh in-memory store): continuing would silently pair the checkpointed server
        state with initial client states.
      ConfigMismatchError: On resume under a `config` other than the recorded one.
      DamagedCheckpointError: The newest checkpoint is damaged and a stateful run cannot fall back to an older one
        (a stateless run falls back, logging which checkpoint was damaged; `Checkpoints.load_latest`).
      NonFiniteLossError: A round's training loss is not finite and `non_finite_clients` is ``'stop'``.
      OutputDirectoryInUseError: Another process is running on ``outputs.directory``.
      OutputDirectoryNotWritableError: A metric row, JSON file or checkpoint cannot be written there.
      TooManyClientsPerRoundError: `clients_per_round` is larger than the number of clients in `client_data`.

    Returns:
      `(final_state, history)`: the state and the metric rows released by this invocation (``metrics.csv`` has
      every round, also those of a resumed earlier invocation).
    """
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f'dropout_rate must be in [0, 1), got {dropout_rate}.')
    if overselection < 1.0:
        raise ValueError(f'overselection must be >= 1, got {overselection}.')
    if non_finite_clients not in NON_FINITE_MODES:
        raise ValueError(f'non_finite_clients must be one of {NON_FINITE_MODES}, got {non_finite_clients!r}.')
    client_ids, every_client, inputs = _participation(client_data, clients_per_round)
    if not every_client and clients_per_round is not None and clients_per_round > len(client_ids):
        raise TooManyClientsPerRoundError(
            f'[{name}] clients_per_round (--clients_per_round) is {clients_per_round}, more than the '
            f'{len(client_ids)} training clients: every round would silently run on all {len(client_ids)}, and '
            f'what the run records (and a DP accountant) would assume {clients_per_round}. Pass '
            f'--clients_per_round={len(client_ids)} to train on every client every round, or fewer.'
        )
    if every_client and (dropout_rate or overselection != 1.0):
        raise ValueError('dropout_rate and overselection apply to sampled participation (a ClientData).')
    if client_evaluation_fn is not None and not (every_client and client_state_store is not None):
        raise ValueError('client_evaluation_fn needs every-client participation and a client state store.')
    if selection is not None and (
        client_evaluation_fn is None and evaluation_fn is None or not every_client or client_state_store is None
    ):
        raise ValueError('selection needs an evaluation, every-client participation and a client state store.')
    if stopping is not None and evaluation_fn is None and client_evaluation_fn is None:
        raise ValueError('stopping needs an evaluation (evaluation_fn or client_evaluation_fn).')
    if stopping is not None and stopping.keep_client_states and (client_state_store is None or selection is not None):
        raise ValueError('stopping.keep_client_states needs a client state store and no selection (both keep states).')
    state = initial_state if initial_state is not None else process.initialize()

    def saved(state: Any) -> Any:  # What a checkpoint holds: the state, plus the selection's and stopping's records.
        if selection is None and stopping is None:
            return state
        record: dict[str, Any] = {'state': state}
        if selection is not None:
            record['selection'] = selection._checkpoint()
        if stopping is not None:
            record['stopping'] = stopping._checkpoint(state)
        return record

    checkpoint = saved(state)
    checkpoints = Checkpoints(outputs)
    checkpoints.recover(client_state_store)
    start_round = 0
    loaded, version = checkpoints.load_latest(checkpoint, client_state_store)
    if loaded is not None:
        start_round = int(version)
        if selection is None and stopping is None:
            state = loaded
        else:
            state = loaded['state']
            if selection is not None:
                selection._restore(loaded['selection'])
            if stopping is not None:
                stopping._restore(loaded['stopping'])
        logging.info('[%s] resumed from checkpoint at round %d', name, start_round)
    if config is not None:
        guard_config(outputs.path(RUN_CONFIG_FILE), config, resuming=loaded is not None)
    template = None
    if client_state_store is not None:
        committed = client_state_store.committed_round()
        if committed < start_round:
            raise ClientStatesLostError(
                f'[{name}] cannot resume from the server checkpoint of round {start_round} in '
                f'{outputs.path("checkpoints")}: the client state store has no private client states committed '
                f'after round {committed}, so the clients would continue from stale or initial states (an '
                f'in-memory store does not outlive its process). Use a persistent store (e.g. --state_store=sqlite) '
                f'to make stateful runs resumable, or delete the checkpoints to start over.'
            )
        client_state_store.rollback(start_round)
        template = private_state_template(process)
    prepare = dataset_fn or (lambda value: value)
    validated: set[str] = set()

    def make_input(client_id: str, round_num: int) -> Any:  # A client's input to a round, validated on first use.
        raw = inputs[client_id] if every_client else client_data.create_tf_dataset_for_client(client_id)
        value = prepare(raw)
        if round_dataset_fn is not None:
            value = round_dataset_fn(client_id, value, round_num)
        if validate_fn is not None and client_id not in validated:
            validate_fn(client_id, value)
            validated.add(client_id)
        return value

    def run_clients(state: Any, participants: Sequence[str], private: list[Any] | None, round_num: int) -> Any:
        run_round = getattr(process, 'run_round', None)  # A PersonalizedProcess packs for its engine.
        round_inputs: Sequence[Any] = LazyDatasets(
            list(participants), functools.partial(make_input, round_num=round_num)
        )
        extra = () if private is None else (private,)
        if run_round is not None:  # The loop decides on a non-finite loss itself (`non_finite_clients`).
            # Inputs that change every round are packed afresh: without ids the engine keeps none between rounds.
            ids = list(participants) if round_dataset_fn is None else None
            return run_round(state, round_inputs, *extra, client_ids=ids, non_finite='ignore')
        return process.next(state, list(round_inputs), *extra)

    def _non_finite_clients(
        state: Any, participants: Sequence[str], private: list[Any] | None, round_num: int
    ) -> list[str]:
        """The participants whose training loss is non-finite when each runs alone from `state`."""
        culprits = []
        for i, client_id in enumerate(participants):
            alone = run_clients(state, [client_id], None if private is None else [private[i]], round_num)
            if non_finite_losses(_train_metrics(alone.metrics, train_metrics_fn)):
                culprits.append(client_id)
        return culprits

    recorded_strategy = None
    per_round = clients_per_round or 0  # Checked >= 1 for sampled participation.

    def sampled_participants(round_num: int) -> tuple[list[str], list[str], int]:
        """``(sampled, participants, dropped)`` of a sampled round: a function of the round alone (its seed)."""
        sampled = sample_clients(client_ids, math.ceil(per_round * overselection), round_num, seed)
        participants, dropped = surviving_clients(sampled, per_round, round_num, seed, dropout_rate)
        return sampled, participants, dropped

    # Sampling is deterministic, so the next round's clients are known: a process whose backend supports it reads
    # their data on a background thread while this round computes (`PersonalizedProcess.prefetch`; results are
    # unchanged). Every-client rounds read the same clients every round: nothing to prefetch.
    prefetch = None if every_client or round_dataset_fn is not None else getattr(process, 'prefetch', None)
    history = []
    train_seconds: list[float] = []
    evaluation_seconds: list[float] = []
    last_line = -math.inf  # When the last round line was logged (progress.should_log_round: a readable rate).
    if stopping is not None and stopping.stopped:
        logging.info('[%s] stopped early before: best %s at round %d', name, stopping.metric, stopping.best_round)
    last_round = start_round if stopping is not None and stopping.stopped else total_rounds
    for round_num in range(start_round + 1, last_round + 1):
        round_start = time.time()
        participation: dict[str, float] = {}
        if every_client:
            participants = client_ids
        else:
            sampled, participants, dropped = sampled_participants(round_num)
            if dropout_rate or overselection != 1.0:
                participation = {'sampled': len(sampled), 'dropped': dropped, 'clients': len(participants)}
            if prefetch is not None:
                # This round's clients first (cached already but for the first round, or evicted ones): the round
                # packs each as soon as it is read, then the next round's are read while this one computes.
                prefetch(LazyDatasets(participants, functools.partial(make_input, round_num=round_num)), participants)
                if round_num < last_round:
                    upcoming = sampled_participants(round_num + 1)[1]
                    prefetch(LazyDatasets(upcoming, functools.partial(make_input, round_num=round_num + 1)), upcoming)
        if not participants:  # Every sampled client dropped out: nothing to aggregate, the state stays.
            logging.warning(
                '[%s] round %d: every sampled client dropped out; the round changes nothing', name, round_num
            )
            history.append(outputs.release_metrics(round_num, {'participation': participation}))
            if round_num % rounds_per_checkpoint == 0 or round_num == total_rounds:
                checkpoints.save(saved(state), round_num, client_state_store)
            continue
        private = (
            None
            if client_state_store is None
            else [unflatten_private_state(s, template) for s in client_state_store.get(participants)]
        )
        result = run_clients(state, participants, private, round_num)
        strategy = getattr(process, 'engine_strategy', None)
        if strategy is not None and strategy != recorded_strategy:
            outputs.write_json(ENGINE_STRATEGY_FILE, {'engine_strategy': strategy, 'from_round': round_num})
            recorded_strategy = strategy
        train = _train_metrics(result.metrics, train_metrics_fn)
        bad_losses = non_finite_losses(train)
        if bad_losses:
            culprits = _non_finite_clients(state, participants, private, round_num)
            if non_finite_clients == 'stop':
                losses = ', '.join(f'{k}={v}' for k, v in bad_losses.items())
                raise NonFiniteLossError(
                    f'[{name}] round {round_num}: non-finite training loss ({losses}) from client(s) '
                    f'{culprits[:20]}{" ..." if len(culprits) > 20 else ""} ({len(culprits)} of '
                    f'{len(participants)} participants). The run stopped before checkpointing round {round_num} '
                    f'(outputs in {outputs.directory}). A diverging model usually means a too large learning rate '
                    "(e.g. lower --client_learning_rate); to drop such clients' updates and go on, pass "
                    "--non_finite_clients=zero (run_learning_process(non_finite_clients='zero')).",
                    round_num=round_num,
                    client_ids=culprits,
                )
            logging.warning(
                '[%s] round %d: %d client(s) with a non-finite loss, their updates zeroed: %s',
                name,
                round_num,
                len(culprits),
                culprits[:20],
            )
        if non_finite_clients == 'zero':
            train = dict(train)
            train['non_finite_clients'] = len(culprits) if bad_losses else 0
        new_private: list[Any] = []
        if client_state_store is not None:
            new_private = list(result.private_states)
            client_state_store.put(participants, [flatten_private_state(p) for p in new_private], round_num)
        faults.point('round')
        state = result.state
        metrics: dict[str, Any] = {'train': train}
        if participation:
            metrics['participation'] = participation
        measured = communication.communication_from_metrics(result.metrics)
        if measured:
            metrics['communication'] = measured
        metrics['round_seconds'] = time.time() - round_start
        if round_metrics_fn is not None:
            metrics.update(round_metrics_fn(round_num, result.metrics))
        train_seconds.append(metrics['round_seconds'])
        evaluated = round_num % rounds_per_evaluation == 0 or round_num == total_rounds
        if evaluated:
            evaluation_start = time.time()
            evaluation: dict[str, Any] = {}
            if evaluation_fn is not None:
                evaluation.update(evaluation_fn(process.get_model_weights(state)))
            if client_evaluation_fn is not None:
                evaluation.update(client_evaluation_fn(process.get_model_weights(state), new_private))
            if evaluation:
                metrics[evaluation_name] = evaluation
            if selection is not None:
                value = float(evaluation[selection.metric])
                if np.isfinite(value) and value < selection.best_value:
                    client_state_store.put(
                        selection.state_ids(participants), [flatten_private_state(p) for p in new_private], round_num
                    )
                    selection.best_value, selection.best_round = value, round_num
            if stopping is not None:
                best = stopping.update(stopping.value_of(evaluation), round_num, state)
                if best and stopping.keep_client_states:  # Every client's, also those not sampled this round.
                    ids = list(client_ids)
                    client_state_store.put(stopping.state_ids(ids), client_state_store.get(ids), round_num)
            evaluation_seconds.append(time.time() - evaluation_start)
            faults.point('evaluation')
        history.append(outputs.release_metrics(round_num, metrics))
        stop = stopping is not None and stopping.stopped
        signalled = stop_signals.pending()
        if round_num % rounds_per_checkpoint == 0 or round_num == total_rounds or stop or signalled:
            checkpoints.save(saved(state), round_num, client_state_store)
        eta = progress.eta_text(train_seconds, evaluation_seconds, round_num, total_rounds, rounds_per_evaluation)
        keys = log_keys if log_keys is not None else _DEFAULT_LOG_KEYS
        shown = {k: history[-1][k] for k in keys if k in history[-1]}
        if progress.should_log_round(
            round_num,
            total_rounds,
            first_round=start_round + 1,
            evaluated=evaluated or stop or signalled,
            seconds_since_last_line=time.monotonic() - last_line,
        ):
            last_line = time.monotonic()
            logging.info(
                '[%s] round %d/%d  %.2fs%s  eta %s  %s',
                name,
                round_num,
                total_rounds,
                metrics['round_seconds'],
                f' + eval {evaluation_seconds[-1]:.1f}s' if evaluated else '',
                eta,
                '  '.join(f'{k}={v:.4f}' for k, v in shown.items()),
            )
        if signalled:
            stop_signals.stop(name, round_num)
        if stop:
            assert stopping is not None
            logging.info(
                '[%s] early stop at round %d: %s did not improve for %s (best %.4f at round %d)',
                name,
                round_num,
                stopping.metric,
                wording.count(stopping.stale, 'evaluations'),
                stopping.best_value,
                stopping.best_round,
            )
            break
    return state, history
