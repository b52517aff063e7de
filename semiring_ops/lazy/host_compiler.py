"""CPU kernels of the lazy reductions: a generated C++17 translation unit compiled into a shared library
(g++ or $CXX) on first use, cached on disk (kernel_cache), and called through ctypes.

The source includes semiring.h (and csrc/lazy/*.h) but no torch header, and exports ``extern "C"``
functions; the caller declares each function's signature once (``HostLibrary.function``) and calls it with
ctypes values or Python ints / floats (pointers as ints, e.g. ``tensor.data_ptr()``).

Environment:
    CXX   the C++ compiler (default: g++); the library is built with -fopenmp, so it needs GCC's
          OpenMP runtime (libgomp, which torch's CPU wheels load anyway)
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..build.jit import source_root
from .kernel_cache import LazyCompileError, cached_artifact, headers_fingerprint, lazy_cache_dir, source_key

__all__ = ["HostFunction", "HostLibrary", "compile_host_library", "host_compiler_available"]

HOST_FLAGS = (
    "-O3",
    "-march=native",
    "-std=c++17",
    "-fPIC",
    "-shared",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fopenmp",
)


def _compiler() -> tuple[str, ...]:
    """The compiler command: $CXX (split like a shell would, so "ccache g++" works) or g++."""
    return tuple(shlex.split(os.environ.get("CXX") or "g++"))


def host_compiler_available() -> bool:
    """Whether a C++ compiler ($CXX or g++) is on PATH."""
    cmd = _compiler()
    return bool(cmd) and shutil.which(cmd[0]) is not None


@functools.cache
def _compiler_version(cmd: tuple[str, ...]) -> str:
    """The first line of ``<cmd> --version`` (part of the cache key)."""
    proc = subprocess.run([*cmd, "--version"], capture_output=True, text=True, check=False)
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return f"{' '.join(cmd)}: {lines[0] if lines else 'unknown version'}"


@functools.lru_cache(maxsize=1)
def _cpu_identity() -> str:
    """The CPU's model and feature flags: -march=native code built on one CPU may not run on another that
    shares the cache (a network home folder), so both are part of the key."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "flags", "Features", "CPU part") and name not in found:
                    found[name] = value.strip()
                if not line.strip() and found:  # the first processor's block is enough
                    break
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} {sorted(found.items())}"


class HostFunction:
    """One exported function with its declared signature; ``call(*args)`` is the ctypes function itself."""

    __slots__ = ("argtypes", "call", "name")

    def __init__(self, name: str, fn: Any, argtypes: Sequence[type], restype: type | None) -> None:
        fn.argtypes = list(argtypes)
        fn.restype = restype
        self.name = name
        self.argtypes = tuple(argtypes)
        # the bound ctypes function: no Python frame between the caller and the conversion + call
        self.call: Callable[..., Any] = fn

    def __repr__(self) -> str:
        return f"HostFunction({self.name!r}, argtypes={[t.__name__ for t in self.argtypes]})"


class HostLibrary:
    """A compiled, loaded shared library of generated kernels."""

    def __init__(self, path: Path, cdll: ctypes.CDLL) -> None:
        self.path = path
        self._cdll = cdll
        self._checked: set[str] = set()

    def _check(self, names: Sequence[str]) -> None:
        for name in names:
            if name not in self._checked:
                try:
                    self._cdll[name]
                except AttributeError:
                    raise AttributeError(f'{self.path} exports no function {name!r} (is it extern "C"?)') from None
                self._checked.add(name)

    def function(self, name: str, argtypes: Sequence[type], restype: type | None = None) -> HostFunction:
        """The exported function ``name`` with the given ctypes signature (restype None: void).

        Each call returns a fresh wrapper (its own ctypes function object), so two declarations of one
        symbol do not interfere; keep the result and reuse it.
        """
        self._check([name])
        return HostFunction(name, self._cdll[name], argtypes, restype)

    def __repr__(self) -> str:
        return f"HostLibrary({str(self.path)!r})"


_lock = threading.Lock()
_cdlls: dict[Path, ctypes.CDLL] = {}
_libraries: dict[tuple[tuple[str, ...], str], HostLibrary] = {}


def _load(path: Path) -> HostLibrary:
    with _lock:
        cdll = _cdlls.get(path)
        if cdll is None:
            cdll = _cdlls[path] = ctypes.CDLL(str(path))
    return HostLibrary(path, cdll)


def _build(cmd: tuple[str, ...], key: str, source: str) -> Callable[[Path], None]:
    def build(tmp: Path) -> None:
        print(
            f"semiring_ops.lazy: compiling a new formula for cpu into {lazy_cache_dir()}", file=sys.stderr, flush=True
        )
        src = tmp.parent / f"{key}.cpp"  # kept beside the library, for reading the generated code
        src.write_text(source)
        args = [*cmd, *HOST_FLAGS, "-I", str(source_root()), str(src), "-o", str(tmp)]
        try:
            proc = subprocess.run(args, capture_output=True, text=True, check=False)
        except OSError as exc:
            src.unlink(missing_ok=True)
            raise LazyCompileError.save(cmd[0], key, source, f"{shlex.join(args)}\n{exc}") from exc
        if proc.returncode != 0:
            src.unlink(missing_ok=True)
            log = f"{shlex.join(args)}\n{proc.stderr}{proc.stdout}"
            raise LazyCompileError.save(f"{cmd[0]} (exit {proc.returncode})", key, source, log)

    return build


def compile_host_library(source: str, functions: Sequence[str]) -> HostLibrary:
    """The shared library of ``source`` (C++17, may include semiring.h, exports ``functions`` extern "C"),
    compiled now (one line on stderr) or taken from the disk cache, loaded once per process.

    Raises LazyCompileError (with the compiler's log) when the source does not compile, AttributeError when
    one of ``functions`` is not exported.
    """
    cmd = _compiler()
    memo = (cmd, source)
    lib = _libraries.get(memo)
    if lib is None:
        if not host_compiler_available():
            raise RuntimeError(f"semiring_ops.lazy: no C++ compiler: {cmd[0] if cmd else '$CXX'} is not on PATH")
        key = source_key(
            source,
            "\0".join(HOST_FLAGS),
            _compiler_version(cmd),
            _cpu_identity(),
            headers_fingerprint(),
        )
        path, _ = cached_artifact(key, ".so", _build(cmd, key, source))
        lib = _load(path)
        lib._check(functions)
        with _lock:
            lib = _libraries.setdefault(memo, lib)
    else:
        lib._check(functions)
    return lib
