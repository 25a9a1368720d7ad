"""The errors a user's input causes (configuration, flags, data files), as opposed to bugs.

Binaries (`fedpersonal.program.experiment_main`) report an `InputError` as a usage error: one line naming the
flag, file, line, field or client, exit status 2. Every other exception is a bug and keeps its traceback.
"""


class InputError(ValueError):
    """A problem in what the user gave: a configuration or flag value, a data file, a resumable output dir."""


class ConfigError(InputError):
    """An experiment configuration (flag) value that is invalid or inconsistent; the message names the flag."""


class DataError(InputError):
    """Input data that cannot be used; the message names the file, line and field (or the client id)."""


class WorkerError(RuntimeError):
    """A remote TFF worker (`fedpersonal.runtime.DistributedRuntime`) failed or went away during a computation.

    Not the user's input: the environment. The message names the worker's address; a run with checkpoints resumes
    from its last one when rerun once the worker is back.

    Attributes:
      address: The worker's ``host:port``.
      detail: What the connection reported (e.g. ``UNAVAILABLE: Socket closed``).
    """

    def __init__(self, address: str, message: str, detail: str = ''):
        super().__init__(message)
        self.address = address
        self.detail = detail
