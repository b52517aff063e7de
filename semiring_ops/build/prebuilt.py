"""Prebuilt kernels: the modules a wheel built with SEMIRING_OPS_BUILD_EXT=1 carries (semiring_ops/_prebuilt/, each
family's library as the JIT builds it, semiring_ops_<device>_<family>.so) and its manifest (semiring_ops/_prebuilt.json,
written by setup.py), which says what they were built for.

A wheel's CUDA modules are of one route (the manifest's ``cuda_route``, docs/build.md "Two routes"): ``nvcc``, the
kernels compiled ahead of time for the manifest's architectures; or ``nvrtc``, the host code alone (built by the C++
compiler, no CUDA toolkit needed), whose kernels NVRTC compiles for the GPU in use on their first launch, so that
they run on any GPU NVRTC targets (wheel_cuda_route says which a build makes).

A prebuilt library is imported only when the manifest matches what is running: the same torch (version, CUDA
version, C++ ABI: a library built against another torch can crash the process when it is loaded, before any Python
error), the CPU's instruction set for the CPU kernels, and for the CUDA kernels a compiled architecture that runs on
the GPU (nvcc) or a usable NVRTC route (nvrtc). Otherwise the package says so in one line and compiles that family
on first use (jit.py), as without a wheel.
"""

from __future__ import annotations

import functools
import json
import platform
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from . import nvrtc_kernels
from .families import AOT_CPU_FLAGS, Family
from .jit import import_library

__all__ = [
    "LIBRARY_FOLDER",
    "MANIFEST_NAME",
    "build_manifest",
    "cuda_route",
    "library_file",
    "load_prebuilt",
    "manifest",
    "mismatch",
    "prebuilt_status",
    "takes_nvrtc",
    "wheel_cuda_route",
]

MANIFEST_NAME = "_prebuilt.json"
LIBRARY_FOLDER = "_prebuilt"  # inside the package: the families' libraries
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def library_file(fam: Family) -> str:
    """The file name of `fam`'s library in the wheel (that of its build in the cache)."""
    return f"{fam.spec().name}.so"


def wheel_cuda_route(choice: str, toolkit_found: bool, nvrtc_problem: str | None) -> str | None:
    """The route of a wheel's CUDA modules (module docstring): with $SEMIRING_OPS_CUDA_KERNELS ``choice`` (auto,
    nvrtc, nvcc), whether a CUDA toolkit was found and why the NVRTC route cannot serve (None: it can). auto: nvcc
    where a toolkit is, else NVRTC; None: no CUDA modules."""
    if choice != "nvrtc" and toolkit_found:
        return "nvcc"
    if choice != "nvcc" and nvrtc_problem is None:
        return "nvrtc"
    return None


def build_manifest(
    modules: list[str], cuda_archs: list[str], cpu_arch: str, cuda_route: str = "nvcc"
) -> dict[str, Any]:
    """What setup.py writes beside the modules it builds: the torch they are for, their targets and the CUDA
    modules' route (nvcc: kernels for ``cuda_archs``; nvrtc: host code, kernels compiled on first launch)."""
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": platform.machine(),
        "cpu_arch": cpu_arch,
        "cuda_archs": cuda_archs,  # e.g. ["8.0", "8.6", "9.0", "12.0+PTX"]; none for the NVRTC route
        "cuda_route": cuda_route,
        "modules": sorted(modules),  # family keys, e.g. ["cpu_bmm", "cuda_chain"]
    }


def cuda_route(info: dict[str, Any] | None = None) -> str:
    """The route of the wheel's CUDA modules (``info``: a manifest, by default the installed one's): nvcc or
    nvrtc (a manifest from before the field: nvcc)."""
    info = manifest() if info is None else info
    return str((info or {}).get("cuda_route", "nvcc"))


def takes_nvrtc(fam: Family) -> bool:
    """Whether the wheel's module of `fam` is the NVRTC route's host code (its kernels compile on first launch)."""
    return fam.device_type == "cuda" and cuda_route() == "nvrtc"


@functools.cache
def manifest() -> dict[str, Any] | None:
    """The installed package's manifest, None without one (a source checkout, a wheel built without kernels)."""
    path = _PACKAGE_DIR / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"unreadable": str(path)}


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


def _arch_runs(archs: list[str], capability: tuple[int, int]) -> bool:
    """Whether code compiled for `archs` (TORCH_CUDA_ARCH_LIST entries: "8.6", "9.0a", "12.0+PTX") runs on a GPU of
    `capability`: SASS of the same major and a minor at most the GPU's (an arch-specific "a" / "f" build: the same
    major and minor), or PTX of a version at most the GPU's, which the driver compiles. ValueError for an entry it
    cannot read."""
    for entry in archs:
        found = _ARCH.match(entry.strip())
        if found is None:
            raise ValueError(f"unreadable CUDA architecture {entry!r}")
        arch = (int(found.group(1)), int(found.group(2)))
        specific, ptx = bool(found.group(3)), bool(found.group(4))
        if arch == capability or (not specific and arch[0] == capability[0] and arch[1] <= capability[1]):
            return True
        if ptx and arch <= capability:
            return True
    return False


def mismatch(fam: Family, info: dict[str, Any], device_index: int | None = None) -> str | None:
    """Why the manifest's build of `fam` cannot be loaded here, or None when it can."""
    if "unreadable" in info:
        return f"its manifest {info['unreadable']} cannot be read"
    if fam.key not in info.get("modules", []):
        return "the wheel has no such module"
    built = f"torch {info.get('torch')}"
    if info.get("torch") != torch.__version__ or info.get("torch_cuda") != torch.version.cuda:
        return f"they were built for {built} (CUDA {info.get('torch_cuda')}), this is torch {torch.__version__}"
    if info.get("cxx11_abi") != bool(torch._C._GLIBCXX_USE_CXX11_ABI):
        return f"they were built for {built} with another C++ ABI"
    if info.get("machine") != platform.machine():
        return f"they were built for {info.get('machine')}, this machine is {platform.machine()}"
    if fam.device_type == "cpu" and info.get("cpu_arch") == "x86-64-v3":
        missing = sorted(set(AOT_CPU_FLAGS) - _cpu_flags())
        if missing:
            return f"they need an x86-64-v3 CPU; this one lacks {', '.join(missing)}"
    if fam.device_type == "cuda" and cuda_route(info) == "nvrtc":
        if nvrtc_kernels.route_choice() == "nvcc":
            return f"its CUDA modules take the NVRTC route and ${nvrtc_kernels.ROUTE_ENV}=nvcc"
        problem = nvrtc_kernels.route_problem() if device_index is not None else None
        if problem is not None:
            return f"its CUDA kernels compile through NVRTC on their first launch, which cannot serve here: {problem}"
        return None
    if fam.device_type == "cuda" and device_index is not None:
        capability = torch.cuda.get_device_capability(device_index)
        try:
            runs = _arch_runs(list(info.get("cuda_archs", [])), capability)
        except ValueError as exc:
            return f"its manifest says {exc}"
        if not runs:
            return (
                f"they were compiled for sm {', '.join(info.get('cuda_archs', []))}, which does not run on this GPU "
                f"(sm {capability[0]}.{capability[1]})"
            )
    return None


def prebuilt_status(fam: Family, device_index: int | None = None) -> tuple[str, str]:
    """("prebuilt", path) when the wheel's build of `fam` can be loaded here, ("mismatch", why) when the wheel has one
    that cannot, ("none", "") when there is no prebuilt module."""
    info = manifest()
    if info is None:
        return "none", ""
    why = mismatch(fam, info, device_index)
    if why is not None:
        return ("none", "") if why == "the wheel has no such module" else ("mismatch", why)
    return "prebuilt", str(_PACKAGE_DIR / LIBRARY_FOLDER / library_file(fam))


_told: set[str] = set()


def load_prebuilt(fam: Family, device_index: int | None = None) -> ModuleType | None:
    """The wheel's module of `fam` when it matches (module docstring); None otherwise, with one line on stderr the
    first time a wheel's module is refused."""
    status, detail = prebuilt_status(fam, device_index)
    if status == "none":
        return None
    if status == "mismatch":
        if detail not in _told:
            _told.add(detail)
            print(
                f"semiring_ops: not loading the prebuilt kernels: {detail}; compiling them on first use instead "
                f"(or install the semiring_ops wheel made for torch {torch.__version__})",
                file=sys.stderr,
                flush=True,
            )
        return None
    return _import_once(detail, fam.spec().name)


@functools.cache
def _import_once(path: str, name: str) -> ModuleType:
    return import_library(Path(path), name)
