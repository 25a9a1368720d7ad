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
returned `main` builds the config from the parsed flags, checks the output
directory (`run_record.check_output_dir`), runs the task inside
`fedpersonal.runtime.LocalRuntime()` (so no TFF worker outlives the run), or
with ``--workers=host:port,...`` inside `fedpersonal.runtime.DistributedRuntime`
on those running workers (with a config's ``engine_strategy`` in `fedpersonal.backends.use`), and prints the
report and the output directory. A
worker that fails mid-run stops the binary with a one-line error naming it
(exit status 3, `fedpersonal.errors.WorkerError`); rerunning resumes from the
last checkpoint. Only the user's mistakes become an
`absl.app.UsageError` with exit status 2 (the Unix convention for usage errors;
the message, naming the flag, file, line or client, is printed alone, without
the binary's description, which ``--help`` prints):
`fedpersonal.errors.InputError` (invalid configuration, unreadable or malformed
data, an output directory that cannot be resumed), bad flag values and unknown
flags (these when the flags are parsed, by `run`). Every other exception is a
bug and keeps its traceback.

**Resuming.** Rerunning a binary with the same ``--output_dir`` resumes its run
if the configuration is the one recorded there (``run_config.json``); another
configuration is refused with every differing flag named (``--flag: recorded ->
given``). Only fields that cannot change the results may differ (``output_dir``,
``rounds_per_checkpoint``, and what a task declares; not ``total_rounds``: the
rule is in `fedpersonal.program.config_parts`). ``--fresh_start`` moves the
previous run's outputs (only the files this package writes) to
``<output_dir>/previous_runs/<UTC time>/`` and starts over; a new directory, or
one whose run was killed before its first checkpoint, starts normally.

**Logging.** Progress is logged at INFO. TensorFlow's C++ log lines (on a CPU
machine: CUDA, cuDNN and TensorRT not found, CPU instruction notices) are off
(``TF_CPP_MIN_LOG_LEVEL=3`` is set before TensorFlow is imported) unless the
environment sets ``TF_CPP_MIN_LOG_LEVEL`` or ``--verbosity`` (``-v``) is 1 or
more, which also logs absl's debug lines (`quiet_tensorflow`). TensorFlow's
start-up lines and each checkpoint's save lines are left out in any case
(`fedpersonal.quiet`) unless ``FEDPERSONAL_VERBOSE_TF=1`` or ``--verbosity`` is
1 or more.

Start-up stays fast: a binary imports only its task's config module (no TensorFlow, no TFF) at the top level
and names `run` (and whatever else needs TensorFlow) by a ``'module:attribute'`` string, imported by `main`
once the flags are parsed. `run(main)` (instead of `absl.app.run(main)`) answers ``-h``, ``--help`` and
``--helpshort`` with the binary's docstring and every flag of its config (help text and default), exit
status 0; ``--helpfull`` is absl's (every flag of every module).
"""

from __future__ import annotations

import functools
import os
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
from fedpersonal import quiet
from fedpersonal.program import config_flags
from fedpersonal.program import output_dir
from fedpersonal.program import run_record

ConfigT = TypeVar('ConfigT')

# A function, or where to import it from once it is needed: 'package.module:attribute'.
Target = Callable[..., Any] | str

# The arguments `run` answers with the binary's help (absl's spellings: one or two dashes, '-?' for '-h').
HELP_ARGS = frozenset({'-h', '-?', '-help', '--help', '-helpshort', '--helpshort'})

USAGE_ERROR_STATUS = 2  # The exit status of a usage error (bad or unknown flag, invalid configuration or data).

FRESH_START_HELP = (
    "Start over in --output_dir even if it holds a run with another configuration: that run's outputs (only the "
    'files fedpersonal writes) are moved to <output_dir>/previous_runs/<UTC time>/ (delete it when no longer '
    'needed). Without it, a rerun resumes the run in --output_dir and refuses a changed configuration.'
)
WORKERS_HELP = (
    "Run TFF's computations on these running TFF workers (host:port,host:port; scripts/start_workers.sh starts "
    "them): each round's clients (the engine's groups) are split over the workers. Empty: TFF's local runtime. "
    'Results equal a local run to float tolerance; a run may resume on another set of workers.'
)
ENGINE_WORKERS_HELP = (
    "Run the engine's compiled rounds on this many engine workers (Ray worker processes, each loading its clients "
    'by id and running its share of the groups; fedpersonal.runtime.engine_workers). 0: in this process. '
    'Results equal a local run to float tolerance.'
)
RAY_ADDRESS_HELP = (
    "The Ray cluster of --engine_workers (HEAD:6379, after 'ray start --head' there and 'ray start "
    "--address=HEAD:6379' on each other machine). Empty: local workers started for the run."
)
ENGINE_WORKERS_BALANCE_HELP = (
    "--engine_workers' shares of a round's groups follow each worker's measured speed (a faster worker gets more "
    'groups): faster rounds when workers differ in speed. Results then equal the equal shares to float '
    'reassociation, not bit for bit (without it, the same seed gives the same numbers).'
)
WORKER_ERROR_STATUS = 3  # A remote worker failed or went away (fedpersonal.errors.WorkerError).
TF_LOG_LEVEL_VARIABLE = 'TF_CPP_MIN_LOG_LEVEL'
QUIET_TF_LOG_LEVEL = '3'  # TensorFlow's C++ logs below FATAL off: the CUDA/cuDNN lines are ERROR level.


def argv_verbosity(argv: Sequence[str]) -> int:
    """absl's ``--verbosity`` (``-v``) as given on the command line `argv` (0 when absent or not a number).

    Example:

    >>> argv_verbosity(['prog', '-v=1']), argv_verbosity(['prog', '--verbosity', '2']), argv_verbosity(['prog'])
    (1, 2, 0)
    """
    value = None
    for i, arg in enumerate(argv[1:], start=1):
        if arg == '--':
            break
        name, eq, given = arg.lstrip('-').partition('=')
        if arg.startswith('-') and name in ('v', 'verbosity'):
            value = given if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def quiet_tensorflow(verbosity: int, environ: dict[str, str] | None = None) -> bool:
    """Turns TensorFlow's C++ log lines off before TensorFlow is imported, unless asked for.

    Args:
      verbosity: absl's ``--verbosity``: 1 or more keeps TensorFlow's own log level and sets
        ``FEDPERSONAL_VERBOSE_TF=1`` (unless set): nothing is filtered (`fedpersonal.quiet`).
      environ: The environment (default: `os.environ`, which TFF's worker processes inherit).

    Returns:
      Whether ``TF_CPP_MIN_LOG_LEVEL`` was set (never when the environment already sets it).

    Example:

    >>> env = {}
    >>> quiet_tensorflow(0, env), env
    (True, {'TF_CPP_MIN_LOG_LEVEL': '3'})
    >>> env = {}
    >>> quiet_tensorflow(0, {'TF_CPP_MIN_LOG_LEVEL': '0'}), quiet_tensorflow(1, env), env
    (False, False, {'FEDPERSONAL_VERBOSE_TF': '1'})
    """
    target: Any = os.environ if environ is None else environ
    if verbosity >= 1:
        target.setdefault(quiet.VERBOSE_VARIABLE, '1')
    if TF_LOG_LEVEL_VARIABLE in target or verbosity >= 1:
        return False
    target[TF_LOG_LEVEL_VARIABLE] = QUIET_TF_LOG_LEVEL
    return True


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
      engine_workers: Whether the task runs rounds on engine workers (`engine_workers.serve`): defines
        ``--engine_workers``, ``--ray_address`` and ``--engine_workers_balance``.
    """

    def __init__(
        self,
        config_cls: type[ConfigT],
        run: Callable[[ConfigT], dict[str, Any]] | str,
        report: Callable[[dict[str, Any], ConfigT], str] | str,
        *,
        default_output_dir: str,
        engine_workers: bool = False,
    ):
        _check_target(run, 'run')
        _check_target(report, 'report')
        self.config_cls = config_cls
        self.default_output_dir = default_output_dir
        self._run = run
        self._report = report
        self._overrides = {'output_dir': default_output_dir}
        config_flags.define_flags(config_cls, overrides=self._overrides)
        if 'fresh_start' not in flags.FLAGS:
            flags.DEFINE_bool('fresh_start', False, FRESH_START_HELP)
        if 'workers' not in flags.FLAGS:
            flags.DEFINE_string('workers', '', WORKERS_HELP)
        self.engine_workers = engine_workers
        names = ['fresh_start', 'workers', 'verbosity']
        if engine_workers:
            if 'engine_workers' not in flags.FLAGS:
                flags.DEFINE_integer('engine_workers', 0, ENGINE_WORKERS_HELP, lower_bound=0)
                flags.DEFINE_string('ray_address', '', RAY_ADDRESS_HELP)
                flags.DEFINE_bool('engine_workers_balance', False, ENGINE_WORKERS_BALANCE_HELP)
            names += ['engine_workers', 'ray_address', 'engine_workers_balance']
        module = config_flags.help_module(config_cls)
        for name in names:  # Listed by --help with the config's flags.
            flags.FLAGS.register_key_flag_for_module(module, flags.FLAGS[name])

    def __call__(self, argv: Sequence[str]) -> None:
        """Builds the config from the parsed flags, checks the output directory, runs the task, prints its report.

        Args:
          argv: The arguments absl left after parsing the flags (only the program name is allowed).

        Raises:
          app.UsageError: Unexpected arguments, an invalid flag value, a resume under another configuration
            (`run_record.ConfigMismatchError`) or any other `errors.InputError`; exit status 2.
        """
        if len(argv) > 1:
            raise app.UsageError(f'Unexpected arguments: {list(argv[1:])}', exitcode=USAGE_ERROR_STATUS)
        verbosity = flags.FLAGS['verbosity']
        if not verbosity.present:
            logging.set_verbosity(logging.INFO)
        quiet_tensorflow(verbosity.value if verbosity.present else 0)
        try:
            config = config_flags.config_from_flags(self.config_cls, overrides=self._overrides)
            record = os.path.join(config.output_dir, run_record.RUN_CONFIG_FILE)
            recorded_before = os.path.exists(record)
            with output_dir.lock(config.output_dir):  # One run per --output_dir (taken before anything is moved).
                try:
                    run_record.check_output_dir(config, fresh_start=flags.FLAGS.fresh_start)
                    # TensorFlow and TFF are imported here, once the flags are parsed and the config is valid.
                    from fedpersonal import backends  # pylint: disable=g-import-not-at-top
                    from fedpersonal import runtime  # pylint: disable=g-import-not-at-top

                    run = load(self._run)
                    # The engine strategy and client cache bound reach every process the task builds
                    # (`backends.use`).
                    strategy = getattr(config, 'engine_strategy', None)
                    packed_cache_mb = getattr(config, 'packed_cache_mb', None)
                    from fedpersonal.runtime import engine_workers  # pylint: disable=g-import-not-at-top

                    request = self._engine_workers_request()
                    with (
                        runtime.for_workers(flags.FLAGS.workers),
                        engine_workers.requested(request),
                        backends.use(backends.current(), strategy=strategy, packed_cache_mb=packed_cache_mb),
                    ):
                        results = run(config)
                except errors.InputError:
                    # A failed start leaves nothing behind: not even the record of a configuration that never ran.
                    if (
                        not recorded_before
                        and not run_record.has_progress(config.output_dir)
                        and os.path.exists(record)
                    ):
                        try:
                            os.remove(record)
                        except OSError as cleanup_error:  # Never masks the error that stopped the run.
                            logging.warning('Could not remove %s after the failed start: %s', record, cleanup_error)
                    raise
        except (errors.InputError, flags.IllegalFlagValueError) as error:
            raise app.UsageError(str(error), exitcode=USAGE_ERROR_STATUS) from None
        except errors.WorkerError as error:  # The environment, not a bug: the message, no traceback.
            logging.error('%s', error)
            print(f'error: {error}', file=sys.stderr)
            raise SystemExit(WORKER_ERROR_STATUS) from None
        print()
        print(load(self._report)(results, config))
        print(f'\nOutputs: {config.output_dir}')

    def _engine_workers_request(self) -> Any:
        """``--engine_workers``/``--ray_address``/``--engine_workers_balance`` as an `engine_workers.Request` (None
        without engine workers)."""
        from fedpersonal.runtime import engine_workers  # pylint: disable=g-import-not-at-top

        if not self.engine_workers or not flags.FLAGS.engine_workers:
            if self.engine_workers and flags.FLAGS.engine_workers_balance:
                raise errors.ConfigError('--engine_workers_balance: it balances engine workers; give --engine_workers.')
            return None
        if flags.FLAGS.workers:
            raise errors.ConfigError('--engine_workers and --workers: give one (engine workers or TFF workers).')
        return engine_workers.Request(
            flags.FLAGS.engine_workers, flags.FLAGS.ray_address or None, flags.FLAGS.engine_workers_balance
        )

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
            "TensorFlow's C++ log lines (CUDA, cuDNN and TensorRT warnings on a CPU machine) are off unless "
            '--verbosity is 1 or more or the environment sets TF_CPP_MIN_LOG_LEVEL.\n'
            "Try --helpfull to get a list of all flags (including --flagfile, absl's logging flags and the deprecated "
            'names of renamed flags).\n'
        )


def define_main(
    config_cls: type[ConfigT],
    run: Callable[[ConfigT], dict[str, Any]] | str,
    report: Callable[[dict[str, Any], ConfigT], str] | str,
    *,
    default_output_dir: str,
    engine_workers: bool = False,
) -> ExperimentMain[ConfigT]:
    """Defines the config's flags and returns an absl `main` for the binary.

    Args:
      config_cls: The task's config dataclass (one flag per field).
      run: The task's `run(config) -> results`, or where to import it from once the flags are parsed
        ('fedpersonal.tasks.movielens_mf:run'), so that defining the flags imports no TensorFlow.
      report: Formats `(results, config)` as the text printed at the end (a callable or a 'module:attribute'
        string, as `run`).
      default_output_dir: The `--output_dir` default of this binary.
      engine_workers: Whether the task runs rounds on engine workers (`engine_workers.serve`): defines
        ``--engine_workers``, ``--ray_address`` and ``--engine_workers_balance``.

    Returns:
      `main(argv)` for `run` (or `absl.app.run`).

    Raises:
      ValueError: `run` or `report` is neither a callable nor a 'module:attribute' string.
    """
    return ExperimentMain(config_cls, run, report, default_output_dir=default_output_dir, engine_workers=engine_workers)


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


def parse_flags(argv: Sequence[str]) -> list[str]:
    """absl's flag parsing for `app.run`, except that a bad or unknown flag exits with status 2 (absl's: 1).

    The error is the one line absl prints (``FATAL Flags parsing error: ...`` naming the flag), no traceback.
    """
    try:
        return flags.FLAGS(list(argv))
    except flags.Error as error:
        sys.stderr.write(f'FATAL Flags parsing error: {error}\nPass --helpshort or --helpfull to see help on flags.\n')
        sys.exit(USAGE_ERROR_STATUS)


def run(main: ExperimentMain[Any], argv: Sequence[str] | None = None) -> None:
    """`absl.app.run(main)`, except that the short help lists the config's flags and exits with status 0, and
    usage errors exit with status 2.

    absl's own ``--help`` lists only the flags the `__main__` module defined (none: `config_flags` defines
    them) and exits with status 1; its flag parsing errors exit with status 1 too (`parse_flags`).

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
    # Its log level is decided first, from --verbosity on the command line (not from a --flagfile).
    quiet_tensorflow(argv_verbosity(argv))
    import tensorflow  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import

    app.run(functools.partial(_usage_errors_alone, main), argv=argv, flags_parser=parse_flags)


def _usage_errors_alone(main: Callable[[Sequence[str]], None], argv: Sequence[str]) -> None:
    """`main(argv)`, printing a usage error's message alone (absl prints the binary's whole docstring first)."""
    try:
        main(argv)
    except app.UsageError as error:
        sys.stderr.write(f'{error}\n')
        sys.stderr.flush()
        sys.exit(error.exitcode if error.exitcode is not None else USAGE_ERROR_STATUS)
