"""Which implementation of the kernel entry points (csrc/ops.h) runs on each device type.

Every backend offers ``bmm_forward(a, b, semiring_id, with_arg)`` and
``log_contract(l0, l1, r0, r1, o0)``. The compiled extension is used when it builds; otherwise the
blocked PyTorch reference (semiring_ops/ops/reference.py) takes over, with one warning naming the cause.

Environment: SEMIRING_OPS_BACKEND=reference forces the reference everywhere.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from . import jit

__all__ = ["Backend", "backend_for", "loaded_backends", "reset", "set_poison_outputs"]


@dataclass
class Backend:
    """The kernels serving one device type."""

    device_type: str
    kind: str  # "compiled" | "prebuilt" | "reference"
    module: Any
    detail: str = ""

    def bmm_forward(self, a, b, semiring_id: int, with_arg: bool):
        return self.module.bmm_forward(a, b, semiring_id, with_arg)

    def log_contract(self, l0, l1, r0, r1, o0):
        return self.module.log_contract(l0, l1, r0, r1, o0)

    def chain_scan(self, em, trans, start, end, lengths, semiring_id: int, reverse: bool, save_scores: bool):
        return self.module.chain_scan(em, trans, start, end, lengths, semiring_id, reverse, save_scores)

    def chain_viterbi(self, em, trans, start, end, lengths, semiring_id: int):
        return self.module.chain_viterbi(em, trans, start, end, lengths, semiring_id)

    def chain_log_backward(self, em, trans, start, end, lengths, alpha, log_z, grad, tags=None):
        return self.module.chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad, tags)

    def crf_log_likelihood(self, em, trans, start, end, lengths, tags):
        return self.module.crf_log_likelihood(em, trans, start, end, lengths, tags)

    def sequence_lengths(self, mask, lengths, tags, batch: int, steps: int, num_tags: int, raise_errors: bool):
        return self.module.sequence_lengths(mask, lengths, tags, batch, steps, num_tags, raise_errors)

    def log_bmm_fast(self, a, b, passes: int):  # the CUDA build only (hasattr(module, "log_bmm_fast"))
        return self.module.log_bmm_fast(a, b, passes)


_lock = threading.Lock()
_backends: dict[str, Backend] = {}
_poison = False


def _reference(device_type: str, reason: str) -> Backend:
    from ..ops import reference  # imported here: ops imports this module

    return Backend(device_type, "reference", reference, detail=reason)


def _build(device_type: str) -> Backend:
    if os.environ.get("SEMIRING_OPS_BACKEND", "auto") == "reference":
        return _reference(device_type, "SEMIRING_OPS_BACKEND=reference")
    if device_type == "cpu":
        spec = jit.CPU_EXTENSION
    elif device_type == "cuda":
        spec = jit.CUDA_EXTENSION
        from torch.utils.cpp_extension import CUDA_HOME

        if torch.version.cuda is None:
            return _reference(device_type, "this torch build has no CUDA")
        prebuilt = importlib.util.find_spec(spec.aot_module) is not None  # jit.load imports it
        if not prebuilt and CUDA_HOME is None:
            return _fallback(device_type, "nvcc / CUDA_HOME not found, so the CUDA kernels cannot be built")
    else:
        return _reference(device_type, f"no compiled kernels for device type {device_type!r}")
    try:
        module = jit.load(spec)
    except Exception as exc:
        first = str(exc).strip().splitlines()
        return _fallback(device_type, f"building the {device_type} kernels failed: {first[0] if first else exc!r}")
    kind = "prebuilt" if module.__name__ == spec.aot_module else "compiled"
    where = getattr(module, "__file__", "") or ""
    return Backend(device_type, kind, module, detail=where)


def _fallback(device_type: str, reason: str) -> Backend:
    warnings.warn(
        f"semiring_ops: {reason}; using the (slower) PyTorch reference implementation on {device_type}.",
        RuntimeWarning,
        stacklevel=4,
    )
    return _reference(device_type, reason)


def backend_for(device: torch.device) -> Backend:
    """The backend for `device`'s type, built (or fallen back) on first use, then cached."""
    key = device.type
    backend = _backends.get(key)
    if backend is None:
        with _lock:
            backend = _backends.get(key)
            if backend is None:
                backend = _build(key)
                _apply_poison(backend)
                _backends[key] = backend
    return backend


def set_poison_outputs(enabled: bool) -> None:
    """Testing aid: compiled kernels allocate outputs filled with NaN (indices with -1) instead of
    uninitialised memory, so an element a kernel fails to write cannot pass for a right answer."""
    global _poison
    _poison = enabled
    for backend in _backends.values():
        _apply_poison(backend)


def _apply_poison(backend: Backend) -> None:
    setter = getattr(backend.module, "set_poison_outputs", None)
    if setter is not None:
        setter(_poison)


def loaded_backends() -> dict[str, Backend]:
    return dict(_backends)


def reset() -> None:
    """Forget the chosen backends (tests use it to re-run the choice)."""
    with _lock:
        _backends.clear()
