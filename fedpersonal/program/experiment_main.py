"""The shared `main` of the experiment binaries: flags -> typed config -> run in a managed runtime -> report.

Each binary in `experiments/` is a task's `run(config)` plus a report; this
module owns the rest, once:

    from fedpersonal.program import experiment_main
    from fedpersonal.tasks import furl_personalization_config

    main = experiment_main.define_main(
        furl_personalization_config.FurlConfig,
        'fedpersonal.tasks.furl_personalization:run',
        report,
        default_output_dir='output/furl',
    )
    if __name__ == '__main__':
        experiment_main.run(main)

`define_main` defines one flag per config field (`config_flags`), and the
returned `main` builds the config from the parsed flags, runs the task inside
`fedpersonal.runtime.LocalRuntime()` (so no TFF worker outlives the run), and
prints the report and the output directory. Only the user's mistakes become an
`absl.app.UsageError` (exit status 2, one line naming the flag, file, line or
client): `fedpersonal.errors.InputError` (invalid configuration, unreadable or
malformed data, an output directory that cannot be resumed) and bad flag values.
Every other exception is a bug and keeps its traceback.

Start-up stays fast: a binary imports only its task's config module (no TensorFlow, no TFF) at the top level
and names `run` (and whatever else needs TensorFlow) by a ``'module:attribute'`` string, imported by `main`
once the flags are parsed. `run(main)` (instead of `absl.app.run(main)`) answers ``-h``, ``--help`` and
``--helpshort`` with the binary's docstring and every flag of its config (help text and default), exit
status 0; ``--helpfull`` is absl's (every flag of every module).
"""

from __future__ import annotations

import pkgutil
import sys
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import Generic
from typing import TypeVar

from absl import app
from absl import flags
from absl import logging

from fedpersonal import errors
from fedpersonal.program import config_flags
from fedpersonal.program import output_dir

ConfigT = TypeVar('ConfigT')

# A function, or where to import it from once it is needed: 'package.module:attribute'.
Target = Callable[..., Any] | str

# The arguments `run` answers with the binary's help (absl's spellings: one or two dashes, '-?' for '-h').
HELP_ARGS = frozenset({'-h', '-?', '-help', '--help', '-helpshort', '--helpshort'})


def _check_target(target: Target, name: str) -> None:
    """Raises `ValueError` unless `target` is a callable or a 'module:attribute' string (imports nothing)."""
    if callable(target):
        return
    module, _, attribute = target.partition(':') if isinstance(target, str) else ('', '', '')
    if not module or not attribute.isidentifier():
        raise ValueError(f"{name} must be a callable or a 'package.module:attribute' string, got {target!r}.")


def load(target: Target) -> Callable[..., Any]:
    """The function `target` names (imported on this call if it is a 'module:attribute' string).

    Args:
      target: A callable (returned as it is) or a 'package.module:attribute' string.

    Returns:
      The callable.

    Example:

    >>> load('os.path:join')('a', 'b')
    'a/b'
    """
    return target if callable(target) else pkgutil.resolve_name(target)


class ExperimentMain(Generic[ConfigT]):
    """The absl `main(argv)` of an experiment binary (made by `define_main`).

    Attributes:
      config_cls: The task's config dataclass (one flag per field).
      default_output_dir: The `--output_dir` default of this binary.
    """

    def __init__(
        self,
        config_cls: type[ConfigT],
        run: Callable[[ConfigT], dict[str, Any]] | str,
        report: Callable[[dict[str, Any], ConfigT], str] | str,
        *,
        default_output_dir: str,
    ):
        _check_target(run, 'run')
        _check_target(report, 'report')
        self.config_cls = config_cls
        self.default_output_dir = default_output_dir
        self._run = run
        self._report = report
        self._overrides = {'output_dir': default_output_dir}
        config_flags.define_flags(config_cls, overrides=self._overrides)

    def __call__(self, argv: Sequence[str]) -> None:
        """Builds the config from the parsed flags, runs the task and prints its report.

        Args:
          argv: The arguments absl left after parsing the flags (only the program name is allowed).

        Raises:
          app.UsageError: Unexpected arguments, an invalid flag value or any other `errors.InputError`.
        """
        if len(argv) > 1:
            raise app.UsageError(f'Unexpected arguments: {list(argv[1:])}')
        logging.set_verbosity(logging.INFO)
        try:
            config = config_flags.config_from_flags(self.config_cls, overrides=self._overrides)
            # TensorFlow and TFF are imported here, once the flags are parsed and the config is valid.
            from fedpersonal import runtime  # pylint: disable=g-import-not-at-top

            run = load(self._run)
            with output_dir.lock(config.output_dir), runtime.LocalRuntime():  # One run per --output_dir.
                results = run(config)
        except (errors.InputError, flags.IllegalFlagValueError) as error:
            raise app.UsageError(str(error)) from None
        print()
        print(load(self._report)(results, config))
        print(f'\nOutputs: {config.output_dir}')

    def usage(self, doc: str | None = None) -> str:
        """The binary's help: `doc` (its usage) and every flag of its config with its help text and default.

        Args:
          doc: The usage text; default: the docstring of `__main__` (the binary), as absl prints it.

        Returns:
          The text `run` prints for ``--help``.
        """
        if doc is None:
            doc = getattr(sys.modules.get('__main__'), '__doc__', None) or f'\nUSAGE: {sys.argv[0]} [flags]\n'
        flag_help = flags.FLAGS.module_help(config_flags.help_module(self.config_cls))
        return (
            f'{doc.rstrip()}\n\nflags:\n{flag_help}\n\n'
            "Try --helpfull to get a list of all flags (including --flagfile and absl's logging flags).\n"
        )


def define_main(
    config_cls: type[ConfigT],
    run: Callable[[ConfigT], dict[str, Any]] | str,
    report: Callable[[dict[str, Any], ConfigT], str] | str,
    *,
    default_output_dir: str,
) -> ExperimentMain[ConfigT]:
    """Defines the config's flags and returns an absl `main` for the binary.

    Args:
      config_cls: The task's config dataclass (one flag per field).
      run: The task's `run(config) -> results`, or where to import it from once the flags are parsed
        ('fedpersonal.tasks.movielens_mf:run'), so that defining the flags imports no TensorFlow.
      report: Formats `(results, config)` as the text printed at the end (a callable or a 'module:attribute'
        string, as `run`).
      default_output_dir: The `--output_dir` default of this binary.

    Returns:
      `main(argv)` for `run` (or `absl.app.run`).

    Raises:
      ValueError: `run` or `report` is neither a callable nor a 'module:attribute' string.
    """
    return ExperimentMain(config_cls, run, report, default_output_dir=default_output_dir)


def wants_help(argv: Sequence[str]) -> bool:
    """Whether `argv` asks for the short help (``-h``, ``--help``, ``--helpshort``) before any ``--``.

    Example:

    >>> wants_help(['prog', '--total_rounds=3', '-h']), wants_help(['prog', '--', '--help'])
    (True, False)
    """
    for arg in argv[1:]:
        if arg == '--':
            return False
        if arg in HELP_ARGS:
            return True
    return False


def run(main: ExperimentMain[Any], argv: Sequence[str] | None = None) -> None:
    """`absl.app.run(main)`, except that the short help lists the config's flags and exits with status 0.

    absl's own ``--help`` lists only the flags the `__main__` module defined (none: `config_flags` defines
    them) and exits with status 1.

    Args:
      main: The binary's `define_main(...)`.
      argv: The command line (default: `sys.argv`).
    """
    argv = list(sys.argv if argv is None else argv)
    if wants_help(argv):
        sys.stdout.write(main.usage())
        sys.stdout.flush()
        sys.exit(0)
    # TensorFlow is imported before absl's `app.run`, not inside it: imported only once absl had parsed the flags,
    # the engine's first round failed in every binary run from the command line ("tensor 'total:0' ... is out of
    # scope": its Keras metrics were built as graph-mode (v1) objects). tests/experiments/command_line_test.py runs a
    # binary as a subprocess to keep this covered. TensorFlow alone takes ~3 s; TFF is still imported after parsing.
    import tensorflow  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import

    app.run(main, argv=argv)
