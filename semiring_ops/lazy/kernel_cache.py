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
from collections.abc import Callable
from pathlib import Path

from ..build.artifacts import CompileError, source_key
from ..build.artifacts import cached_artifact as _cached_artifact
from ..build.jit import cache_root, source_root

__all__ = [
    "LazyCompileError",
    "artifact_path",
    "cached_artifact",
    "headers_fingerprint",
    "lazy_cache_dir",
    "source_key",
]


def lazy_cache_dir() -> Path:
    """$SEMIRING_OPS_LAZY_CACHE if set, else ``cache_root() / "lazy"`` (which honours SEMIRING_OPS_CACHE)."""
    env = os.environ.get("SEMIRING_OPS_LAZY_CACHE")
    if env:
        return Path(env).expanduser()
    return cache_root() / "lazy"


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
    """build/artifacts.py's cached_artifact, in lazy_cache_dir() unless `folder` is given."""
    return _cached_artifact(key, suffix, build, lazy_cache_dir() if folder is None else folder)


class LazyCompileError(CompileError):
    """A generated kernel failed to compile (build/artifacts.py CompileError, saved under the lazy cache's failed/)."""

    who = "semiring_ops.lazy"

    @classmethod
    def save(cls, what: str, key: str, source: str, log: str, folder: Path | None = None) -> LazyCompileError:
        error = super().save(what, key, source, log, lazy_cache_dir() / "failed" if folder is None else folder)
        assert isinstance(error, LazyCompileError)
        return error
