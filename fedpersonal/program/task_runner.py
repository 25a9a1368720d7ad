"""What every experiment task repeats around `run_learning_process`: its arguments from the config parts, the
client state store of a stateful process, and the dispatch of a configuration name to the function running it.

A task passes its config (a dataclass inheriting `config_parts`) and only what differs between its rows:

    state, _ = task_runner.run_process(
        process, cfg, outputs=outputs, client_data=train, dataset_fn=batch, evaluation_fn=evaluate, name='fedavg'
    )

`run_process` reads each part the config has: `RoundsConfig` (rounds, checkpoint period, non-finite mode),
`SamplingConfig` (clients per round, dropout, over-selection, and the seed, which only sampling uses) and
`EvaluationConfig` (evaluation period). A config without `SamplingConfig` runs every client every round (its
client data is a sequence or mapping of every client's input), so the loop gets no sampling argument at all.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import TypeVar

from fedpersonal import errors
from fedpersonal.program import config_parts

_Runner = TypeVar('_Runner')

CLIENT_STATES_FILE = 'client_states.sqlite'
STATE_STORES = ('sqlite', 'memory')


def process_arguments(config: config_parts.RoundsConfig, total_rounds: int | None = None) -> dict[str, Any]:
    """The `run_learning_process` keyword arguments that `config`'s parts set.

    Args:
      config: A task config inheriting `RoundsConfig` (and possibly `SamplingConfig`, `EvaluationConfig`).
      total_rounds: The rounds to run when the task derives them otherwise (e.g. from epochs); default
        ``config.total_rounds``.

    Returns:
      ``total_rounds``, ``rounds_per_checkpoint`` and ``non_finite_clients``; with `SamplingConfig` also
      ``clients_per_round``, ``dropout_rate``, ``overselection`` and ``seed``; with `EvaluationConfig` also
      ``rounds_per_evaluation``.

    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True, kw_only=True)
    ... class Config(config_parts.RoundsConfig, config_parts.EvaluationConfig):
    ...     pass
    >>> sorted(process_arguments(Config(total_rounds=3)).items())  # doctest: +NORMALIZE_WHITESPACE
    [('non_finite_clients', 'stop'), ('rounds_per_checkpoint', 10), ('rounds_per_evaluation', 10),
     ('total_rounds', 3)]
    """
    arguments: dict[str, Any] = {
        'total_rounds': config.total_rounds if total_rounds is None else total_rounds,
        'rounds_per_checkpoint': config.rounds_per_checkpoint,
        'non_finite_clients': config.non_finite_clients,
    }
    if isinstance(config, config_parts.SamplingConfig):
        # The seed only drives sampling and dropout: an every-client run keeps the loop's default.
        arguments.update(
            clients_per_round=config.clients_per_round,
            dropout_rate=config.client_dropout_rate,
            overselection=config.overselection,
            seed=config.seed,
        )
    if isinstance(config, config_parts.EvaluationConfig):
        arguments['rounds_per_evaluation'] = config.rounds_per_eval
    return arguments


def run_process(
    process: Any,
    parts: config_parts.RoundsConfig,
    /,
    *,
    outputs: Any,
    client_data: Any,
    name: str,
    total_rounds: int | None = None,
    **kwargs: Any,
) -> tuple[Any, list[dict[str, float]]]:
    """Runs `process` with `fedpersonal.program.run_learning_process`, its shared arguments taken from `parts`.

    Args:
      process: The learning process.
      parts: The task's config; its parts give the arguments of `process_arguments` (positional: a
        ``config=`` keyword is `run_learning_process`'s configuration guarded on resume).
      outputs: The row's `ExperimentOutputs`.
      client_data: The training clients (see `run_learning_process`).
      name: The run's name in progress lines.
      total_rounds: Rounds to run instead of ``parts.total_rounds``.
      **kwargs: Everything else `run_learning_process` takes (``dataset_fn``, ``evaluation_fn``, ``stopping``,
        ``client_state_store``, ...): what differs between rows.

    Returns:
      `run_learning_process`'s ``(final state, metrics history of this process' rounds)``.
    """
    from fedpersonal.program import training_loop  # pylint: disable=g-import-not-at-top  # TF: imported on use.

    arguments = process_arguments(parts, total_rounds)
    overlap = sorted(set(arguments) & set(kwargs))
    if overlap:  # The config is the one source of these: a second value would silently win or lose.
        raise TypeError(f'run_process takes {overlap} from the config, not as arguments.')
    return training_loop.run_learning_process(
        process, client_data=client_data, outputs=outputs, name=name, **arguments, **kwargs
    )


def open_store(kind: str, outputs: Any, spec: Any, default: Callable[[str], Any], filename: str = CLIENT_STATES_FILE):
    """A client state store for a stateful process's private states (`fedpersonal.client_state`).

    Args:
      kind: ``'sqlite'`` (durable, a killed run resumes) or ``'memory'`` (the tasks' ``--state_store``).
      outputs: The row's `ExperimentOutputs`; the SQLite file goes in its directory.
      spec: ``[(shape, dtype), ...]`` of a client's flat private state.
      default: ``client_id -> state`` of a client not yet stored.
      filename: The SQLite file's name in the row's directory.

    Raises:
      errors.ConfigError: `kind` is not one of `STATE_STORES`.
    """
    from fedpersonal import client_state  # pylint: disable=g-import-not-at-top  # TF: imported on use.

    if kind == 'memory':
        return client_state.InMemoryClientStateStore(spec, default)
    if kind == 'sqlite':
        return client_state.SqliteClientStateStore(outputs.path(filename), spec, default)
    raise errors.ConfigError(f'state_store must be one of {STATE_STORES}, got {kind!r}.')


def runner_for(registry: Mapping[str, _Runner], name: str, what: str = 'configuration') -> _Runner:
    """`registry[name]`: the function a task runs for a configuration (method, algorithm) `name`.

    A task's registry replaces a chain of ``if name == ...`` branches; its config validation names the allowed
    values for the user, so an unknown name here is a task registering fewer names than its config allows.

    Raises:
      errors.ConfigError: `name` is not registered (the message lists the registered names).

    >>> runner_for({'fedavg': 1}, 'fedavg')
    1
    >>> runner_for({'fedavg': 1}, 'ditto')
    Traceback (most recent call last):
    ...
    fedpersonal.errors.ConfigError: unknown configuration 'ditto'; one of ['fedavg'].
    """
    try:
        return registry[name]
    except KeyError:
        raise errors.ConfigError(f'unknown {what} {name!r}; one of {sorted(registry)}.') from None
