"""One run per output directory, and clear errors when an output directory cannot be written.

* `lock(directory)`: holds an exclusive `fcntl.flock` on ``<directory>/.lock`` (the file records the holder's pid)
  for the duration of a ``with`` block. A second process taking the lock of the same directory gets
  `OutputDirectoryInUseError` naming the directory and the holder's pid, instead of interleaving its metrics and
  checkpoints with the first run's. The kernel releases the lock when the holding process dies, also by SIGKILL,
  so a killed run never blocks its restart (its lock file stays, with a stale pid; a finished run deletes it).
  Re-entrant within a process (a binary locks its ``--output_dir``, the training loop each run's sub-directory).
* `writing(directory)`: turns an operating-system write failure inside the block (read-only directory, full disk,
  quota; an `OSError` or TensorFlow's file errors) into `OutputDirectoryNotWritableError` naming the directory and
  the cause, instead of a deep traceback.

Both errors are `fedpersonal.errors.InputError`: a binary reports them in one line, exit status 2. This module does
not import TensorFlow.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator

from fedpersonal import errors

LOCK_FILE = '.lock'
_held: dict[str, list[int]] = {}  # Real path of a locked directory -> [file descriptor, depth].


class OutputDirectoryInUseError(errors.InputError):
    """Another process is running on this output directory."""


class OutputDirectoryNotWritableError(errors.InputError):
    """The output directory (or a file in it) cannot be written: read-only, full, or not permitted."""


def _tensorflow_file_errors() -> tuple[type[BaseException], ...]:
    tf = sys.modules.get('tensorflow')
    if tf is None:  # Not imported: nothing of TensorFlow can have raised.
        return ()
    return (tf.errors.PermissionDeniedError, tf.errors.ResourceExhaustedError)


@contextlib.contextmanager
def writing(directory: str) -> Iterator[None]:
    """Raises `OutputDirectoryNotWritableError` naming `directory` for a file-system write failure in the block.

    Raises:
      OutputDirectoryNotWritableError: An `OSError` (e.g. ``EACCES``, ``EROFS``, ``ENOSPC``, ``EDQUOT``) or
        TensorFlow's ``PermissionDeniedError`` or ``ResourceExhaustedError``.
    """
    try:
        yield
    except Exception as error:
        if not isinstance(error, (OSError, *_tensorflow_file_errors())) or isinstance(
            error, (FileNotFoundError, IsADirectoryError, NotADirectoryError, OutputDirectoryNotWritableError)
        ):
            raise  # A missing file is a bug or a concurrent deletion, not a full or read-only directory.
        cause = getattr(error, 'message', None) or str(error)
        raise OutputDirectoryNotWritableError(
            f'Cannot write to the output directory {directory}: {cause}. Free space or make it writable (or pass '
            f'another --output_dir); the last complete checkpoint in it is kept and a restart resumes from it.'
        ) from error


def _failure(directory: str, operation: str, error: OSError) -> OutputDirectoryNotWritableError:
    """The usage error for an `operation` on the output `directory` that failed with `error`."""
    cause = error.strerror or str(error)
    if isinstance(error, (FileNotFoundError, NotADirectoryError, FileExistsError)):
        advice = 'check that its parent is a directory you can write'
    else:
        advice = 'make it writable or free space'
    return OutputDirectoryNotWritableError(
        f'Cannot {operation} the output directory {directory}: {cause} ({advice}, or pass another --output_dir).'
    )


@contextlib.contextmanager
def lock(directory: str) -> Iterator[None]:
    """Holds the exclusive lock of `directory` (created if missing) for the ``with`` block.

    Raises:
      OutputDirectoryInUseError: Another live process holds it (the message names the directory and its pid).
      OutputDirectoryNotWritableError: The directory or its lock file cannot be created (also a path under a
        regular file or in a file system that refuses new directories, such as ``/proc``).
    """
    key = os.path.realpath(directory)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    path = os.path.join(directory, LOCK_FILE)
    created = not os.path.isdir(directory)
    while True:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise _failure(directory, 'create', error) from error
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise _failure(directory, f'create its lock file {LOCK_FILE} in', error) from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors='replace').strip() or 'unknown'
            os.close(fd)
            raise OutputDirectoryInUseError(
                f'The output directory {directory} is in use by another run (process {holder}); wait for it to '
                f'finish or stop it, or pass another --output_dir. Two runs on one directory would mix their '
                f'metrics and checkpoints.'
            ) from None
        try:  # Locked the file at `path`, unless its holder deleted it (on release) between our open and flock.
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(current, os.fstat(fd)):
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
        _held[key] = [fd, 1]
        try:
            yield
        finally:
            del _held[key]
            # Deleted while still locked (a process that opened it meanwhile sees it gone and retries), so a run
            # leaves no lock file behind and a start that failed before writing anything leaves no directory.
            with contextlib.suppress(OSError):
                os.remove(path)
                if created:
                    os.rmdir(directory)  # Only if empty.
    finally:
        os.close(fd)  # Releases the flock.
