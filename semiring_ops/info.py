"""What is active: versions, devices, the compilers found, and for each kernel family what serves it (prebuilt,
compiled and cached, not built yet, or the PyTorch reference and why), without compiling anything."""

from __future__ import annotations

import platform
from typing import Any

import torch

from . import __version__
from .build import backends, jit, nvrtc_kernels, prebuilt, toolkit
from .build.families import CPU_ARCH_ENV, DEFAULT_CPU_ARCH, FAMILIES, cpu_arch
from .lazy import hopper_gemm
from .lazy.dispatch import lazy_backend
from .lazy.kernel_cache import lazy_cache_dir

__all__ = ["backend_info", "format_info", "kernel_summary"]


def backend_info(load: bool = False) -> dict[str, Any]:
    """A dict describing the installation. Nothing is compiled; with load=True every family that can be had
    without compiling (prebuilt, or in the cache) is loaded, so the report says what runs."""
    devices = [
        {
            "index": i,
            "name": torch.cuda.get_device_name(i),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
        }
        for i in range(torch.cuda.device_count())
    ]
    device_types = ["cpu"] + (["cuda"] if devices or torch.version.cuda else [])
    families = []
    for fam in FAMILIES:
        if fam.device_type not in device_types:
            continue
        kind, detail = backends.family_status(fam.device_type, fam.name)
        if load and kind in ("prebuilt", "compiled") and (fam.device_type == "cpu" or devices):
            backends.backend_for(torch.device(fam.device_type)).family(fam.name)
            kind, detail = backends.family_status(fam.device_type, fam.name)
        families.append(
            {"device": fam.device_type, "family": fam.name, "kind": kind, "detail": detail, "serves": fam.serves}
        )
    nvrtc_route = None
    if torch.version.cuda:
        problem = nvrtc_kernels.route_problem()
        nvrtc_route = {
            "choice": nvrtc_kernels.route_choice(),
            "families": [f.name for f in FAMILIES if f.nvrtc],
            "usable": problem is None,
            "why_not": problem,
            "cache": str(nvrtc_kernels.cache_dir()),
        }
    cuda_toolkit = None
    if torch.version.cuda:
        tk = toolkit.find_cuda_toolkit(jit.cache_root())
        if tk:
            cuda_toolkit = {"home": str(tk.home), "source": tk.source, "nvcc": tk.version}
        elif _cuda_families_served(families):
            # not an error: every CUDA family is prebuilt or compiles through NVRTC, so nvcc is only the other route
            cuda_toolkit = {
                "not_needed": "none found, not needed (every CUDA family is prebuilt or takes the NVRTC route); "
                f"for the nvcc route instead: pip install '{toolkit.cuda_extra()}'"
            }
        else:
            cuda_toolkit = {"missing": toolkit.missing_toolkit_reason(jit.cache_root())}
    wheel = prebuilt.manifest()
    return {
        "semiring_ops": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cuda_devices": devices,
        "cache": str(jit.cache_root()),
        "lazy_cache": str(lazy_cache_dir()),
        "cxx": toolkit.cxx_compiler(),
        "cpu_arch": cpu_arch(),  # the CPU families' target when compiled here
        "cuda_toolkit": cuda_toolkit,
        "nvrtc_route": nvrtc_route,
        "prebuilt": {k: wheel[k] for k in ("torch", "torch_cuda", "cpu_arch", "cuda_archs", "cuda_route") if k in wheel}
        if wheel
        else None,
        "families": families,
        "lazy": {dt: "{} ({})".format(*lazy_backend(dt)) for dt in device_types if dt == "cpu" or devices},
        "lazy_exact_sums": {f"cuda:{d['index']}": hopper_gemm.describe(d["index"]) for d in devices},
    }


def _cuda_families_served(families: list[dict[str, Any]]) -> bool:
    """Whether no CUDA family of backend_info's rows is left to the reference: with no toolkit, each is prebuilt or
    takes the NVRTC route (backends.family_status says so, by the same rules that will serve it)."""
    cuda = [f for f in families if f["device"] == "cuda"]
    return bool(cuda) and all(f["kind"] not in ("reference", "none") for f in cuda)


def _cpu_target(arch: str) -> str:
    return "the compiler's default target" if arch == DEFAULT_CPU_ARCH else f"-march={arch}"


def format_info(info: dict[str, Any]) -> str:
    lines = [
        f"semiring_ops {info['semiring_ops']}  (torch {info['torch']}, CUDA {info['torch_cuda']}, "
        f"Python {info['python']})",
        f"build cache: {info['cache']}",
        f"lazy kernel cache: {info['lazy_cache']}",
        f"C++ compiler: {info['cxx'] or 'none found'} (CPU kernels compiled here for {_cpu_target(info['cpu_arch'])}, "
        f"${CPU_ARCH_ENV})",
    ]
    tk = info["cuda_toolkit"]
    if tk is not None:
        if "home" in tk:
            lines.append(f"CUDA toolkit: {tk['home']} (nvcc {tk['nvcc']}, {tk['source']})")
        else:
            lines.append(f"CUDA toolkit: {tk.get('not_needed') or tk['missing']}")
    route = info["nvrtc_route"]
    if route is not None:
        lines.append(
            f"NVRTC route (${nvrtc_kernels.ROUTE_ENV}={route['choice']}; families {', '.join(route['families'])}): "
            + (f"usable, kernels cached in {route['cache']}" if route["usable"] else f"not usable: {route['why_not']}")
        )
    wheel = info["prebuilt"]
    if wheel:
        archs = ", ".join(wheel.get("cuda_archs", [])) or "none"
        if wheel.get("cuda_route") == "nvrtc":
            archs = "any (CUDA host code prebuilt, kernels compiled by NVRTC on their first launch)"
        lines.append(f"prebuilt kernels: for torch {wheel.get('torch')}, CPU {wheel.get('cpu_arch')}, sm {archs}")
    else:
        lines.append("prebuilt kernels: none (kernels compile on first use)")
    lines.append(
        "CUDA devices: "
        + (", ".join(f"cuda:{d['index']} {d['name']} (sm {d['capability']})" for d in info["cuda_devices"]) or "none")
    )
    lines.append("kernel families:")
    width = max((len(f["family"]) for f in info["families"]), default=0)
    for f in info["families"]:
        lines.append(f"  {f['device']:4s} {f['family']:{width}s} {f['kind']:10s} {f['detail']}")
        lines.append(f"  {'':4s} {'':{width}s} {'':10s} ({f['serves']})")
    lines.append("std matmul: torch.matmul")
    lines.append("lazy reductions: " + ", ".join(f"{dt}: {v}" for dt, v in info["lazy"].items()))
    if info["lazy_exact_sums"]:
        sums = ", ".join(f"{d}: {v}" for d, v in info["lazy_exact_sums"].items())
        lines.append(f"lazy matrix route, exact sums past D = 128: {sums}")
    return "\n".join(lines)


def kernel_summary() -> str:
    """The families loaded in this process and what serves them, one line ("cpu chain: compiled, ..."), for
    examples and benchmarks to print beside their figures."""
    loaded = [
        f"{dt} {name}: {state.kind}"
        for dt, backend in backends.loaded_backends().items()
        for name, state in backend.families.items()
    ]
    return ", ".join(loaded) or "none loaded"
