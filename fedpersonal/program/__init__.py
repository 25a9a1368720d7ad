"""Experiment programs: resumable training loop and the output directory.

The names below are imported from their submodules on first use, like the subpackages of `fedpersonal`: the
modules the binaries need to define and parse their flags (`config_parts`, `config_flags`, `experiment_main`)
import neither TensorFlow nor TFF, and `import fedpersonal.program` alone must not import them either
(`outputs` and `training_loop` do).

Example:

>>> from fedpersonal import program
>>> 'ExperimentOutputs' in program.__all__
True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:  # The static view of the lazily imported names (mypy, IDEs).
    from fedpersonal.program.checkpoints import DamagedCheckpointError
    from fedpersonal.program.non_finite import NonFiniteLossError
    from fedpersonal.program.output_dir import OutputDirectoryInUseError
    from fedpersonal.program.output_dir import OutputDirectoryNotWritableError
    from fedpersonal.program.outputs import ExperimentOutputs
    from fedpersonal.program.outputs import colormap
    from fedpersonal.program.outputs import flatten_metrics
    from fedpersonal.program.outputs import new_figure
    from fedpersonal.program.outputs import plot_curves
    from fedpersonal.program.outputs import replace_marked_section
    from fedpersonal.program.outputs import save_figure
    from fedpersonal.program.outputs import save_figure_with_side_legend
    from fedpersonal.program.outputs import write_json
    from fedpersonal.program.participation import sample_clients
    from fedpersonal.program.run_record import check_output_dir
    from fedpersonal.program.run_record import command_line
    from fedpersonal.program.seeds import mean_over_seeds
    from fedpersonal.program.seeds import run_seeds
    from fedpersonal.program.seeds import seed_output_dir
    from fedpersonal.program.selection import EarlyStopping
    from fedpersonal.program.selection import ModelSelection
    from fedpersonal.program.task_runner import open_store
    from fedpersonal.program.task_runner import run_process
    from fedpersonal.program.task_runner import runner_for
    from fedpersonal.program.training_loop import RUN_CONFIG_FILE
    from fedpersonal.program.training_loop import ClientStatesLostError
    from fedpersonal.program.training_loop import ConfigMismatchError
    from fedpersonal.program.training_loop import TooManyClientsPerRoundError
    from fedpersonal.program.training_loop import flatten_private_state
    from fedpersonal.program.training_loop import guard_config
    from fedpersonal.program.training_loop import run_learning_process
    from fedpersonal.program.training_loop import unflatten_private_state

# Exported name -> the submodule that defines it.
_EXPORTS = {
    'DamagedCheckpointError': 'checkpoints',
    'NonFiniteLossError': 'non_finite',
    'OutputDirectoryInUseError': 'output_dir',
    'OutputDirectoryNotWritableError': 'output_dir',
    'ExperimentOutputs': 'outputs',
    'flatten_metrics': 'outputs',
    'new_figure': 'outputs',
    'colormap': 'outputs',
    'plot_curves': 'outputs',
    'replace_marked_section': 'outputs',
    'save_figure': 'outputs',
    'save_figure_with_side_legend': 'outputs',
    'write_json': 'outputs',
    'check_output_dir': 'run_record',
    'command_line': 'run_record',
    'mean_over_seeds': 'seeds',
    'run_seeds': 'seeds',
    'seed_output_dir': 'seeds',
    'EarlyStopping': 'selection',
    'ModelSelection': 'selection',
    'RUN_CONFIG_FILE': 'training_loop',
    'ClientStatesLostError': 'training_loop',
    'TooManyClientsPerRoundError': 'training_loop',
    'ConfigMismatchError': 'training_loop',
    'flatten_private_state': 'training_loop',
    'guard_config': 'training_loop',
    'run_learning_process': 'training_loop',
    'sample_clients': 'participation',
    'open_store': 'task_runner',
    'run_process': 'task_runner',
    'runner_for': 'task_runner',
    'unflatten_private_state': 'training_loop',
}
_SUBMODULES = (
    'checkpoints',
    'config_flags',
    'config_parts',
    'experiment_main',
    'non_finite',
    'output_dir',
    'outputs',
    'participation',
    'run_record',
    'seeds',
    'selection',
    'stop_signals',
    'task_runner',
    'training_loop',
)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Imports an exported name (or a submodule) of `fedpersonal.program` on first use.

    Args:
      name: An exported name (e.g. 'ExperimentOutputs') or a submodule (e.g. 'outputs').

    Returns:
      The object, which is also cached in this module's namespace.

    Raises:
      AttributeError: `name` is neither.
    """
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f'{__name__}.{_EXPORTS[name]}'), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f'{__name__}.{name}')
    else:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))
