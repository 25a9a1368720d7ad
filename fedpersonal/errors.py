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
