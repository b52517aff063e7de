"""Compiled artefacts cached one file each (the lazy reductions' kernels, the NVRTC route's kernels), and the error
of a compile that failed.

A file ``<folder>/<key><suffix>`` is named by a hash of everything that determines it (source_key), so a cached file
is never stale. A process that finds the file uses it without locking; one that does not takes an exclusive lock file
(fcntl, released by the OS even if the process dies), checks again, builds into a temporary file of its own in the
same folder and renames it into place (atomic): concurrent processes share the cache, and a reader never sees a
partial file.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from .jit import _exclusive

__all__ = ["CompileError", "cached_artifact", "source_key"]

_LOG_LINES = 40  # lines of the compiler's log quoted in a CompileError's message


def source_key(*parts: str | bytes) -> str:
    """The first 24 hex digits of the sha256 of the parts (each length-prefixed, so boundaries count)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:24]


def cached_artifact(key: str, suffix: str, build: Callable[[Path], None], folder: Path) -> tuple[Path, bool]:
    """``(<folder>/<key><suffix>, built_now)``: the cached file, or one ``build(tmp)`` writes now.

    ``build`` writes the artefact to the path it is given (a temporary file in the same folder, unique to this
    process and thread) and raises on failure; the file is then renamed into place. Concurrent callers for one key,
    in any process, build once: the others wait on the lock and find the file.
    """
    final = folder / f"{key}{suffix}"
    if final.is_file():
        return final, False
    folder.mkdir(parents=True, exist_ok=True)
    with _exclusive(folder / f"{key}.lock"):
        if final.is_file():  # another process (or thread) built it while we waited
            return final, False
        tmp = folder / f"{key}{suffix}.tmp{os.getpid()}.{threading.get_ident()}"
        try:
            build(tmp)
            if not tmp.is_file():
                raise RuntimeError(f"semiring_ops: the build of {final.name} wrote no file")
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
    return final, True


class CompileError(RuntimeError):
    """A kernel failed to compile: ``.log`` is the compiler's output, ``.source_path`` the saved source (its full
    log lies beside it, ``.log_path``)."""

    who = "semiring_ops"  # the messages' prefix

    def __init__(self, message: str, log: str, source_path: Path | None, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log = log
        self.source_path = source_path
        self.log_path = log_path

    @classmethod
    def save(cls, what: str, key: str, source: str, log: str, folder: Path) -> CompileError:
        """The error for a failed compile of ``source`` (``what``: e.g. "g++" or "NVRTC for sm_90"), after saving
        the source and the full log as ``<folder>/<key>.src`` and ``.log``."""
        source_path: Path | None = folder / f"{key}.src"
        log_path: Path | None = folder / f"{key}.log"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            source_path.write_text(source)
            log_path.write_text(log)
            where = f"source saved to {source_path}, full log to {log_path}"
        except OSError as exc:  # an unwritable cache must not hide the compiler's message
            source_path = log_path = None
            where = f"the source and log could not be saved ({exc})"
        lines = log.strip().splitlines()
        quoted = "\n".join(lines[:_LOG_LINES])
        if len(lines) > _LOG_LINES:
            quoted += f"\n... ({len(lines) - _LOG_LINES} more lines)"
        message = f"{cls.who}: {what} failed to compile a kernel; {where}\n{quoted}"
        return cls(message, log, source_path, log_path)
