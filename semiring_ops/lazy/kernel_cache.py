"""The on-disk cache of the lazy reductions' compiled kernels (CPU shared libraries, CUDA cubins).

One file per artefact, ``<dir>/<key><suffix>``, named by a hash of everything that determines it (source,
flags, compiler version, target, and the csrc headers the source includes), so a cached file is never
stale. A process that finds the file uses it without locking; a process that does not takes an exclusive
lock file (fcntl, released by the OS even if the process dies), checks again, builds into a temporary file
of its own in the same folder and renames it into place (atomic), so concurrent processes share the cache
and a reader never sees a partial file. Failed compilations leave their source and log under
``<dir>/failed/``.

Environment:
    SEMIRING_OPS_LAZY_CACHE   the folder (default: <semiring_ops cache root>/lazy; see build/jit.py)
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from ..build.jit import _exclusive, cache_root, source_root

__all__ = [
    "LazyCompileError",
    "artifact_path",
    "cached_artifact",
    "headers_fingerprint",
    "lazy_cache_dir",
    "source_key",
]

_LOG_LINES = 40  # lines of the compiler's log quoted in a LazyCompileError's message


def lazy_cache_dir() -> Path:
    """$SEMIRING_OPS_LAZY_CACHE if set, else ``cache_root() / "lazy"`` (which honours SEMIRING_OPS_CACHE)."""
    env = os.environ.get("SEMIRING_OPS_LAZY_CACHE")
    if env:
        return Path(env).expanduser()
    return cache_root() / "lazy"


def source_key(*parts: str | bytes) -> str:
    """The first 24 hex digits of the sha256 of the parts (each length-prefixed, so boundaries count)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def headers_fingerprint() -> str:
    """A hash of every header under csrc (semiring.h, lazy/*.h, ...), for the keys of sources including them.

    Computed once per process: a header edited while a process runs is seen by the next process.
    """
    root = source_root()
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".h", ".cuh") and p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:24]


def artifact_path(key: str, suffix: str, folder: Path | None = None) -> Path:
    """Where the artefact ``key`` + ``suffix`` lives in the cache ``folder`` (default: lazy_cache_dir()), built or
    not."""
    return (lazy_cache_dir() if folder is None else folder) / f"{key}{suffix}"


def cached_artifact(
    key: str, suffix: str, build: Callable[[Path], None], folder: Path | None = None
) -> tuple[Path, bool]:
    """``(<dir>/<key><suffix>, built_now)``: the cached file, or one ``build(tmp)`` writes now.

    ``build`` writes the artefact to the path it is given (a temporary file in the same folder, unique to
    this process and thread) and raises on failure; the file is then renamed into place. Concurrent callers
    for one key, in any process, build once: the others wait on the lock and find the file.
    """
    folder = lazy_cache_dir() if folder is None else folder
    final = artifact_path(key, suffix, folder)
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
                raise RuntimeError(f"semiring_ops.lazy: the build of {final.name} wrote no file")
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
    return final, True


class LazyCompileError(RuntimeError):
    """A generated kernel failed to compile: ``.log`` is the compiler's output, ``.source_path`` the saved
    source (its full log lies beside it, ``.log_path``)."""

    def __init__(self, message: str, log: str, source_path: Path | None, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log = log
        self.source_path = source_path
        self.log_path = log_path

    @classmethod
    def save(cls, what: str, key: str, source: str, log: str) -> LazyCompileError:
        """The error for a failed compile of ``source`` (``what``: e.g. "g++" or "NVRTC for sm_90"), after
        saving the source and the full log as ``<dir>/failed/<key>.src`` and ``.log``."""
        folder = lazy_cache_dir() / "failed"
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
        message = f"semiring_ops.lazy: {what} failed to compile a generated kernel; {where}\n{quoted}"
        return cls(message, log, source_path, log_path)
