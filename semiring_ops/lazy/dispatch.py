"""Which implementation runs a plan on each device type: the generated kernels (C++ on the CPU, CUDA through
NVRTC on GPUs) when they can be compiled here, otherwise the PyTorch implementation, with one warning naming
the cause.

Plans whose wide sums are squared distances or dot products of an i and a j variable take the matrix-unit route
(gemm_route.py: GEMMs, then the generated kernel reading their matrix) when their size warrants it.

Environment: SEMIRING_OPS_LAZY_BACKEND=torch forces the PyTorch implementation everywhere;
SEMIRING_OPS_LAZY_GEMM=off|on never / always takes the matrix-unit route.
"""

from __future__ import annotations

import os
import warnings

import torch

from .plan import CallArgs, Plan

__all__ = ["execute", "lazy_backend"]

_choice: dict[str, tuple[str, str]] = {}


def lazy_backend(device_type: str) -> tuple[str, str]:
    """("compiled" | "torch", why) for a device type; decided once per process."""
    if device_type in _choice:
        return _choice[device_type]
    if os.environ.get("SEMIRING_OPS_LAZY_BACKEND", "auto") == "torch":
        choice = ("torch", "SEMIRING_OPS_LAZY_BACKEND=torch")
    elif device_type == "cpu":
        from .host_compiler import host_compiler_available

        ok = host_compiler_available()
        choice = ("compiled", "g++") if ok else ("torch", "no C++ compiler found ($CXX or g++)")
    elif device_type == "cuda":
        from .nvrtc import nvrtc_available

        ok, why = nvrtc_available()
        choice = ("compiled", "nvrtc") if ok else ("torch", why)
    else:
        choice = ("torch", f"no lazy kernels for device type {device_type!r}")
    if choice[0] == "torch" and choice[1] != "SEMIRING_OPS_LAZY_BACKEND=torch":
        warnings.warn(
            f"semiring_ops.lazy: {choice[1]}; reductions on {device_type} use the (slower) PyTorch implementation.",
            RuntimeWarning,
            stacklevel=3,
        )
    _choice[device_type] = choice
    return choice


def execute(plan: Plan, call: CallArgs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    kind, _ = lazy_backend(device.type)
    if kind == "torch":
        from .torch_backend import run_torch

        return run_torch(plan, call)
    if plan.grams == 0 and "Sum(" in plan.key:  # squared distances and dot products as GEMMs (gemm_route.py)
        from .gemm_route import run_routed
        from .linear_route import run_linear

        # vector terms: the gradients' form, a repeated scalar cell; on the CPU also K @ b with b of at least
        # linear_route.MIN_PRODUCT_DIM columns (S @ b; on CUDA the kernel is faster)
        vector = "Repeat" in plan.key or (device.type == "cpu" and plan.formula.dim > 1)
        routed = run_linear(plan, call, device) if vector else None
        routed = routed if routed is not None else run_routed(plan, call, device)
        if routed is not None:
            return routed
    if device.type == "cuda":
        from .cuda_kernels import run_cuda

        return run_cuda(plan, call, device)
    from .cpu_kernels import run_cpu

    return run_cpu(plan, call)
