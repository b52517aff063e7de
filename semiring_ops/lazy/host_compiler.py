"""CPU kernels of the lazy reductions: a generated C++17 translation unit compiled into a shared library
(g++ or $CXX) on first use, cached on disk (kernel_cache), and called through ctypes.

The source includes semiring.h (and csrc/lazy/*.h) but no torch header, and exports ``extern "C"``
functions; the caller declares each function's signature once (``HostLibrary.function``) and calls it with
ctypes values or Python ints / floats (pointers as ints, e.g. ``tensor.data_ptr()``).

Every generated source includes one header first, csrc/lazy/host_prelude.h. With GCC it is precompiled once per
cache and compiler (``<lazy cache>/pch-<key>/lazy/host_prelude.h.gch``, found ahead of the header by the include
path; built in the background while the first kernels compile without it), which takes a kernel's compile from
0.71 s to 0.38 s (the mean over 30 of the test suite's kernels, g++ 12, idle 2-core machine); when it cannot be
built, or with another compiler, the header is parsed as usual.

Environment:
    CXX   the C++ compiler (default: g++); the library is built with -fopenmp, so it needs GCC's
          OpenMP runtime (libgomp, which torch's CPU wheels load anyway)
    SEMIRING_OPS_LAZY_PCH=0   no precompiled header
"""

from __future__ import annotations

import atexit
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

from ..build.jit import _first_line, source_root
from .kernel_cache import LazyCompileError, cached_artifact, headers_fingerprint, lazy_cache_dir, source_key

__all__ = [
    "HostFunction",
    "HostLibrary",
    "compile_command",
    "compile_host_library",
    "host_compiler_available",
    "precompiled_prelude",
]

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


PRELUDE_HEADER = "lazy/host_prelude.h"  # the header every generated CPU source includes first (codegen.py)


def _compiler() -> tuple[str, ...]:
    """The compiler command: $CXX (split like a shell would, so "ccache g++" works) or g++."""
    return tuple(shlex.split(os.environ.get("CXX") or "g++"))


def host_compiler_available() -> bool:
    """Whether a C++ compiler ($CXX or g++) is on PATH."""
    cmd = _compiler()
    return bool(cmd) and shutil.which(cmd[0]) is not None


@functools.cache
def _version_output(cmd: tuple[str, ...]) -> tuple[str, str]:
    """(stdout, stderr) of ``<cmd> --version``, run once per process."""
    proc = subprocess.run([*cmd, "--version"], capture_output=True, text=True, check=False)
    return proc.stdout, proc.stderr


def _compiler_version(cmd: tuple[str, ...]) -> str:
    """The first line of ``<cmd> --version`` (part of the cache key)."""
    out, err = _version_output(cmd)
    lines = (out or err).strip().splitlines()
    return f"{' '.join(cmd)}: {lines[0] if lines else 'unknown version'}"


def _is_gcc(cmd: tuple[str, ...]) -> bool:
    """Whether ``cmd`` is GCC (whose precompiled headers ``#include`` finds beside the header), not clang."""
    text = "".join(_version_output(cmd))
    return "Free Software Foundation" in text and "clang" not in text


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


_PCH_FLAGS = tuple(f for f in HOST_FLAGS if f != "-shared")  # a link flag, which GCC's check of a header ignores
_pch_lock = threading.Lock()
_pch_builds: dict[Path, threading.Thread] = {}  # a precompiled header's path -> its build in this process
_pch_failed: set[Path] = set()  # headers whose build failed in this process: not tried again
_pch_children: dict[subprocess.Popen, Path] = {}  # running header compiles -> their temporary output
_exiting = False


def _prelude_pch_path(cmd: tuple[str, ...]) -> Path | None:
    """Where the precompiled PRELUDE_HEADER for ``cmd`` lives in the cache (built or not), or None when none is
    used (not GCC, or SEMIRING_OPS_LAZY_PCH=0)."""
    if os.environ.get("SEMIRING_OPS_LAZY_PCH", "1") == "0" or not _is_gcc(cmd):
        return None
    key = source_key("pch", "\0".join(_PCH_FLAGS), _compiler_version(cmd), _cpu_identity(), headers_fingerprint())
    return lazy_cache_dir() / f"pch-{key}" / f"{PRELUDE_HEADER}.gch"


def _pch_folder(gch: Path) -> Path:
    """The include folder a precompiled ``<folder>/lazy/host_prelude.h.gch`` is found from."""
    return gch.parents[len(Path(PRELUDE_HEADER).parts) - 1]


def precompiled_prelude(cmd: tuple[str, ...], wait: bool = False) -> Path | None:
    """The include folder holding ``lazy/host_prelude.h.gch`` for ``cmd`` when it is built, else None.

    A cache without one gets it built in the background (once per process and cache; other processes wait on
    its lock in their own background thread): the first kernels of a fresh cache parse the header meanwhile
    (about 1.4 s of building, once), so no call waits for it. ``wait=True`` waits for the build. A failed build
    is said once and the kernels go on parsing the header."""
    gch = _prelude_pch_path(cmd)
    if gch is None or gch in _pch_failed:
        return None
    if not gch.is_file():
        with _pch_lock:
            job = _pch_builds.get(gch)
            if job is None:
                job = _pch_builds[gch] = threading.Thread(
                    target=_build_prelude, args=(cmd, gch), name="semiring_ops.lazy precompiled header", daemon=True
                )
                job.start()
        if not wait:
            return None
        job.join()
        if not gch.is_file():
            return None
    return _pch_folder(gch)


def _build_prelude(cmd: tuple[str, ...], gch: Path) -> None:
    """Builds the precompiled header at ``gch`` through the cache's lock (the background thread's work)."""
    folder = _pch_folder(gch)
    header = source_root() / PRELUDE_HEADER

    def build(tmp: Path) -> None:
        print(f"semiring_ops.lazy: precompiling {PRELUDE_HEADER} for cpu into {lazy_cache_dir()}", file=sys.stderr)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        args = [*cmd, *_PCH_FLAGS, "-I", str(source_root()), "-x", "c++-header", str(header), "-o", str(tmp)]
        with _pch_lock:
            if _exiting:
                raise OSError("the process is exiting")
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            _pch_children[proc] = tmp
        try:
            _, err = proc.communicate()
        finally:
            with _pch_lock:
                _pch_children.pop(proc, None)
        if proc.returncode != 0:
            if _exiting:
                raise OSError("stopped as the process exits")
            raise LazyCompileError.save(f"{cmd[0]} (exit {proc.returncode})", folder.name, header.read_text(), err)

    try:
        cached_artifact(folder.name, f"/{gch.relative_to(folder)}", build)
    except (LazyCompileError, OSError, RuntimeError) as exc:
        _pch_failed.add(gch)
        if not _exiting:
            log = exc.log.splitlines() if isinstance(exc, LazyCompileError) else []
            why = next((line.strip() for line in log if "error" in line), _first_line(exc))
            print(f"semiring_ops.lazy: no precompiled header ({why}); kernels compile without", file=sys.stderr)


@atexit.register
def _abandon_prelude_builds() -> None:
    """A process that exits while a header compiles stops the compiler and leaves no partial file; the next
    process starts the build again."""
    global _exiting
    with _pch_lock:
        _exiting = True
        children = list(_pch_children.items())
    for proc, tmp in children:
        proc.kill()
        proc.wait()
        tmp.unlink(missing_ok=True)


def compile_command(cmd: tuple[str, ...], src: Path, out: Path, uses_prelude: bool) -> list[str]:
    """The command compiling ``src`` into the library ``out``; a source that includes PRELUDE_HEADER first gets the
    precompiled header's folder ahead of csrc on the include path (building it if the cache has none)."""
    pch = precompiled_prelude(cmd) if uses_prelude else None
    includes = [*(["-I", str(pch)] if pch is not None else []), "-I", str(source_root())]
    return [*cmd, *HOST_FLAGS, *includes, str(src), "-o", str(out)]


def _build(cmd: tuple[str, ...], key: str, source: str, what: str) -> Callable[[Path], None]:
    def build(tmp: Path) -> None:
        print(f"semiring_ops.lazy: compiling {what} for cpu into {lazy_cache_dir()}", file=sys.stderr, flush=True)
        src = tmp.parent / f"{key}.cpp"  # kept beside the library, for reading the generated code
        src.write_text(source)
        args = compile_command(cmd, src, tmp, uses_prelude=f'#include "{PRELUDE_HEADER}"' in source)
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


def compile_host_library(source: str, functions: Sequence[str], what: str = "a new formula") -> HostLibrary:
    """The shared library of ``source`` (C++17, may include semiring.h, exports ``functions`` extern "C"),
    compiled now (one line on stderr) or taken from the disk cache, loaded once per process.

    Raises LazyCompileError (with the compiler's log) when the source does not compile, AttributeError when
    one of ``functions`` is not exported. ``what``: the source, for the line on stderr.
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
        path, _ = cached_artifact(key, ".so", _build(cmd, key, source, what))
        lib = _load(path)
        lib._check(functions)
        with _lock:
            lib = _libraries.setdefault(memo, lib)
    else:
        lib._check(functions)
    return lib
