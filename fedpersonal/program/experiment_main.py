"""The shared `main` of the experiment binaries: flags -> typed config -> run in a managed runtime -> report.

Each binary in `experiments/` is a task's `run(config)` plus a report; this
module owns the rest, once:

    main = experiment_main.define_main(
        furl_personalization.FurlConfig, furl_personalization.run, report, default_output_dir='output/furl')
    if __name__ == '__main__':
        app.run(main)

`define_main` defines one flag per config field (`config_flags`), and the
returned `main` builds the config from the parsed flags, runs the task inside
`fedpersonal.runtime.LocalRuntime()` (so no TFF worker outlives the run), and
prints the report and the output directory. Only the user's mistakes become an
`absl.app.UsageError` (exit status 2, one line naming the flag, file, line or
client): `fedpersonal.errors.InputError` (invalid configuration, unreadable or
malformed data, an output directory that cannot be resumed) and bad flag values.
Every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import TypeVar

from absl import app
from absl import flags
from absl import logging

from fedpersonal import errors
from fedpersonal import runtime
from fedpersonal.program import config_flags

ConfigT = TypeVar('ConfigT')


def define_main(
    config_cls: type[ConfigT],
    run: Callable[[ConfigT], dict[str, Any]],
    report: Callable[[dict[str, Any], ConfigT], str],
    *,
    default_output_dir: str,
) -> Callable[[list[str]], None]:
    """Defines the config's flags and returns an absl `main` for the binary.

    Args:
      config_cls: The task's config dataclass (one flag per field).
      run: The task's `run(config) -> results`.
      report: Formats `(results, config)` as the text printed at the end.
      default_output_dir: The `--output_dir` default of this binary.

    Returns:
      `main(argv)` for `absl.app.run`.
    """
    overrides = {'output_dir': default_output_dir}
    config_flags.define_flags(config_cls, overrides=overrides)

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
        logging.set_verbosity(logging.INFO)
        try:
            config = config_flags.config_from_flags(config_cls, overrides=overrides)
            with runtime.LocalRuntime():
                results = run(config)
        except (errors.InputError, flags.IllegalFlagValueError) as error:
            raise app.UsageError(str(error)) from None
        print()
        print(report(results, config))
        print(f'\nOutputs: {config.output_dir}')

    return main
