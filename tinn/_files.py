"""Files that tinn writes and reads: written whole or not at all, read only when they are regular files.

:func:`write_atomically` writes a temporary file beside the destination, flushes it to disk and renames it over
the destination, so that an error, a Ctrl-C or a killed process never leaves a half-written file: the previous
one stays whole until the new one replaces it. Beyond that it behaves as writing in place would:

* a symlink stays a symlink: the file written is its target (``os.path.realpath``);
* the new file keeps the old one's permission bits, and a new file gets the umask's (``0o666 & ~umask``), not
  the ``0o600`` of a temporary file;
* the temporary file is named after its destination and the writing process
  (``.tinn-<name>.<pid>.<random>.tmp``); a save that was killed leaves one behind, and the next save to the
  same destination removes it (only those of processes that no longer run, and none another thread of this
  process is writing);
* an ``OSError`` names the destination.

:func:`open_regular` opens a file for reading without blocking and refuses anything but a regular file (a FIFO,
a device such as ``/dev/zero``, a directory), and with ``max_bytes`` a file larger than that.
"""
from __future__ import annotations

import os
import re
import stat
import tempfile

import numpy as np

_writing: set = set()       # temporary files this process is writing now (a set's add, discard and `in` are atomic
                            # under the GIL: no lock, which an interrupt at the wrong line could leave held)


def write_atomically(path, write, what: str):
    """Call ``write(f)`` on a new binary file and put it at ``path`` in one rename (module docstring);
    ``what`` names the file in errors (``"cannot save the checkpoint"``)."""
    path = os.fspath(path)
    target = os.path.realpath(path)
    directory, name = os.path.split(target)
    mode = _mode_for(target)
    tmp = None
    try:
        _remove_stale(directory, name)
        fd, tmp = tempfile.mkstemp(prefix=f".tinn-{name}.{os.getpid()}.", suffix=".tmp", dir=directory)
        _writing.add(tmp)
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), mode)
            _unmasked(write, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)             # never leaves a half-written file behind
        _writing.discard(tmp)
        tmp = None
        _fsync_directory(directory)
    except OSError as e:
        raise type(e)(e.errno, f"{what}: {e.strerror or e}", path) from None
    finally:
        if tmp is not None:
            _writing.discard(tmp)
            try:
                os.remove(tmp)
            except OSError:
                pass


def _unmasked(write, f):
    """``write(f)``; a ``KeyboardInterrupt`` that a library's cleanup turned into another exception (zipfile's
    "Can't close the ZIP file while there is an open writing handle", when a Ctrl-C lands in ``np.savez``) is
    raised as itself."""
    try:
        write(f)
    except Exception as e:
        cause = e.__context__
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__context__
        if cause is None:
            raise
        raise cause.with_traceback(None) from None


def _mode_for(target: str) -> int:
    """The permission bits of the file at ``target``, or for a new file ``0o666`` less the umask."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where the system tells (Linux), else by setting it back."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove_stale(directory: str, name: str):
    """Remove the temporary files that writes to ``name`` by processes no longer running left in ``directory``."""
    prefix = f".tinn-{name}."
    try:
        entries = [e for e in os.listdir(directory) if e.startswith(prefix) and e.endswith(".tmp")]
    except OSError:
        return
    for entry in entries:
        pid = entry[len(prefix):].split(".", 1)[0]
        tmp = os.path.join(directory, entry)
        if not pid.isdigit() or _running(int(pid), tmp):
            continue
        try:
            os.remove(tmp)
        except OSError:
            pass


def _running(pid: int, tmp: str) -> bool:
    """Whether the process ``pid`` may still be writing ``tmp`` (this process: only while a thread writes it)."""
    if pid == os.getpid():
        return tmp in _writing
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                         # it exists (owned by someone else), or the system cannot tell
        return True
    return True


def _fsync_directory(directory: str):
    """Make a rename in ``directory`` durable (where the platform can open directories)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_regular(path: str, what: str, max_bytes: int | None = None):
    """``path`` opened for binary reading, refused (``ValueError`` naming ``path`` and ``what``) unless it is a
    regular file of at most ``max_bytes`` bytes. Opening does not block (a FIFO), and the checks are made on
    the opened file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a {what} (not a regular file)")
        if max_bytes is not None and info.st_size > max_bytes:
            raise ValueError(f"{path}: not a {what} ({info.st_size:,} bytes, more than the {max_bytes:,} it can "
                             f"have)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_json_depth(text: bytes, limit: int):
    """``ValueError`` if the JSON ``text`` nests arrays and objects more than ``limit`` deep, found before any
    parser recurses into them: escaped characters dropped, then all but quotes and brackets, then the strings
    (what is left between quotes), and the depth is the running count of opening less closing brackets."""
    structure = _ESCAPED.sub(b"", text).translate(None, _NOT_STRUCTURE)
    brackets = np.frombuffer(_STRING.sub(b"", structure), np.uint8)
    if brackets.size:
        depth = np.cumsum(np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1))
        if depth.max() > limit:
            raise ValueError(f"JSON nested more than {limit} deep")


_ESCAPED, _STRING = re.compile(rb"\\.", re.DOTALL), re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"')
