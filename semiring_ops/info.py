"""What is active: versions, devices, which backend serves each op, the build cache."""

from __future__ import annotations

import platform
from typing import Any

import torch

from . import __version__
from .build import jit
from .build.backends import backend_for
from .lazy.dispatch import lazy_backend
from .lazy.kernel_cache import lazy_cache_dir
from .semirings import SEMIRINGS

__all__ = ["backend_info", "format_info"]


def backend_info(load: bool = True) -> dict[str, Any]:
    """A dict describing the installation. With load=True the kernels are built (or fetched from the
    cache) for the CPU and, when a GPU is visible, for CUDA, so the report says what will really run."""
    devices = [
        {
            "index": i,
            "name": torch.cuda.get_device_name(i),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
        }
        for i in range(torch.cuda.device_count())
    ]
    device_types = ["cpu"] + (["cuda"] if devices else [])
    backends = {}
    for dt in device_types:
        if load:
            be = backend_for(torch.device(dt))
            backends[dt] = {"kind": be.kind, "detail": be.detail}
        else:
            backends[dt] = {"kind": "not loaded", "detail": ""}
    ops = {}
    for name, _s in SEMIRINGS.items():
        if name == "std":
            ops[f"{name} matmul"] = "torch.matmul"
        else:
            ops[f"{name} matmul"] = {dt: b["kind"] for dt, b in backends.items()}
    # the fused chains (CRF / HMM): chain_scan (every semiring), chain_viterbi, chain_log_backward
    ops["chain scan, viterbi, log backward"] = {dt: b["kind"] for dt, b in backends.items()}
    # lazy reductions: generated kernels (g++ / NVRTC) or the PyTorch fallback, decided per device type
    ops["lazy reductions"] = {dt: _lazy_backend(dt) if load else "not probed" for dt in device_types}
    return {
        "semiring_ops": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cuda_devices": devices,
        "cache": str(jit.cache_root()),
        "lazy_cache": str(lazy_cache_dir()),
        "backends": backends,
        "ops": ops,
    }


def _lazy_backend(device_type: str) -> str:
    kind, why = lazy_backend(device_type)
    return f"{kind} ({why})"


def format_info(info: dict[str, Any]) -> str:
    lines = [
        f"semiring_ops {info['semiring_ops']}  (torch {info['torch']}, CUDA {info['torch_cuda']}, "
        f"Python {info['python']})",
        f"build cache: {info['cache']}",
        f"lazy kernel cache: {info['lazy_cache']}",
        "CUDA devices: "
        + (", ".join(f"cuda:{d['index']} {d['name']} (sm {d['capability']})" for d in info["cuda_devices"]) or "none"),
        "backends:",
    ]
    for dt, b in info["backends"].items():
        lines.append(f"  {dt:5s} {b['kind']:10s} {b['detail']}")
    lines.append("ops:")
    for op, where in info["ops"].items():
        where_s = where if isinstance(where, str) else ", ".join(f"{k}: {v}" for k, v in where.items())
        lines.append(f"  {op:12s} {where_s}")
    return "\n".join(lines)
