"""Which implementation of the kernel entry points (csrc/ops.h) runs on each device type, family by family.

A Backend serves one device type. Each kernel family (families.py) is loaded the first time one of its entry
points is called: the wheel's prebuilt module when it matches this torch (prebuilt.py), else the JIT build from
the cache, compiled then if needed (jit.py; CUDA with the toolkit toolkit.py finds). A family that cannot be had
falls back: the bmm and chain families to the blocked PyTorch reference (build/reference.py), the
others to None, which their callers replace with PyTorch code or the generic path. One warning per device type
says why, what it costs and the fix (a missing compiler or CUDA toolkit), or one per family whose build failed.

Environment: SEMIRING_OPS_BACKEND=reference forces the reference everywhere.
"""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from ..semirings import MaxSemiring, MinSemiring
from . import jit, prebuilt, reference, toolkit
from .families import Family, families_for, family

__all__ = [
    "Backend",
    "FamilyState",
    "backend_for",
    "family_status",
    "loaded_backends",
    "reference_backend",
    "reset",
    "set_poison_outputs",
]

# families whose entry points the PyTorch reference implements; the others' callers handle None
_REFERENCE_FAMILIES = ("bmm", "chain")


@dataclass
class FamilyState:
    """A loaded family: what serves it (kind: prebuilt | compiled | reference | none), the module and a detail
    (the library's path, or why it fell back)."""

    kind: str
    module: Any
    detail: str = ""


@dataclass
class Backend:
    """The kernels serving one device type. ``forced``: the reference everywhere, with this reason."""

    device_type: str
    forced: str = ""
    families: dict[str, FamilyState] = field(default_factory=dict)

    # ---------------------------------------------------------------- families

    def family(self, name: str) -> Any:
        """The module serving family `name` (loaded, built or fallen back on first use): compiled, prebuilt, the
        reference module, or None."""
        state = self.families.get(name)
        if state is None:
            state = self._load(name)
        return state.module

    def _load(self, name: str) -> FamilyState:
        with _family_lock(self.device_type, name):
            state = self.families.get(name)
            if state is None:
                fam = _family_or_none(self.device_type, name)
                if fam is None:  # no such family on this device type (fast_log on the CPU, any on meta)
                    state = (
                        FamilyState("reference", reference, self.forced)
                        if (name in _REFERENCE_FAMILIES)
                        else FamilyState("none", None, f"no {name} kernels for {self.device_type}")
                    )
                else:
                    state = _load_family(self, fam)
                setter = getattr(state.module, "set_poison_outputs", None)
                if setter is not None and state.kind != "reference":
                    setter(_poison)
                self.families[name] = state
        return state

    @property
    def kind(self) -> str:
        """prebuilt | compiled | reference | mixed: what serves the families loaded so far, or, before any, what
        will (reference only when forced or no compiler can build them)."""
        kinds = {s.kind for s in self.families.values() if s.kind != "none"}
        if len(kinds) == 1:
            return kinds.pop()
        if kinds:
            return "mixed"
        return _expected_kind(self)

    @property
    def detail(self) -> str:
        return self.forced or "; ".join(f"{n}: {s.kind} {s.detail}" for n, s in self.families.items())

    def autograd_node(self, family: str, name: str) -> Any:
        """The family's C++ autograd entry point `name` (csrc/autograd/autograd.h: a kernel recorded with its
        backward as one node), or None where the family has none (the PyTorch reference): the caller then records
        the registered operator, whose Python autograd formula is the node's reference."""
        return getattr(self.family(family), name, None)

    # ---------------------------------------------------------------- the entry points (csrc/ops.h)

    def bmm_forward(self, a, b, semiring_id: int, with_arg: bool):
        """The bmm family's bmm_forward, or for float32 / float16 / bfloat16 max / min without an index on a GPU, the
        packed family's select kernel when it fills the GPU (_packed_pays; its output holds the correctly rounded
        values of the input dtype)."""
        if self.device_type == "cuda" and not with_arg and a.dtype in _PACKED_DTYPES and semiring_id in _PACKED_MAX:
            packed = self.family("packed")
            if packed is not None and _packed_pays(packed, a, b):
                return packed.bmm_packed_select(a, b, _PACKED_MAX[semiring_id]), a.new_empty((0,), dtype=torch.long)
        return self.family("bmm").bmm_forward(a, b, semiring_id, with_arg)

    def log_contract(self, l0, l1, r0, r1, o0):
        return self.family("bmm").log_contract(l0, l1, r0, r1, o0)

    def log_bmm_grads(self, a, b, c, g, need_a: bool, need_b: bool):
        return self.family("bmm").log_bmm_grads(a, b, c, g, need_a, need_b)

    def chain_scan(self, em, trans, start, end, lengths, semiring_id: int, reverse: bool, save_scores: bool):
        return self.family("chain").chain_scan(em, trans, start, end, lengths, semiring_id, reverse, save_scores)

    def chain_viterbi(self, em, trans, start, end, lengths, semiring_id: int):
        return self.family("chain").chain_viterbi(em, trans, start, end, lengths, semiring_id)

    def chain_log_backward(self, em, trans, start, end, lengths, alpha, log_z, grad, tags=None):
        """-> (g_em, g_trans, g_start, g_end, beta, weight) from the kernels, beta and weight empty unless the pair
        marginals stayed off chip (ops.h; chain_ops.py then adds their sum); the four gradients from the reference."""
        return self.family("chain").chain_log_backward(em, trans, start, end, lengths, alpha, log_z, grad, tags)

    def crf_log_likelihood(self, em, trans, start, end, lengths, tags):
        return self.family("chain").crf_log_likelihood(em, trans, start, end, lengths, tags)

    def sequence_lengths(self, mask, lengths, tags, batch: int, steps: int, num_tags: int, raise_errors: bool):
        return self.family("chain").sequence_lengths(mask, lengths, tags, batch, steps, num_tags, raise_errors)


# ---------------------------------------------------------------- the select kernel's choice (packed family)

_PACKED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_PACKED_MAX = {MaxSemiring.kernel_id: True, MinSemiring.kernel_id: False}
_device_props: dict[int, tuple[int, int]] = {}  # device index -> (multiprocessors, major capability)


def _packed_pays(packed, a, b) -> bool:
    """Whether the packed family's select kernel (max / min-plus without an index, 128 x 128 tiles) beats the tile
    engine on (B, n, k) x (B, k, m): sm_80+ and its tiles fill the GPU (at least 2 blocks per SM; below that the
    engine's 64 x 64 tiles spread wider: H100, B = 8, n = 256, 16-bit: 0.093 ms packed, 0.053 ms fp32)."""
    index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    known = _device_props.get(index)
    if known is None:
        props = torch.cuda.get_device_properties(index)
        known = _device_props[index] = (props.multi_processor_count, props.major)
    sms, major = known
    if major < 8 or a.shape[2] == 0:
        return False
    rows, cols = packed.tile_shape()
    blocks = a.shape[0] * -(-a.shape[1] // rows) * -(-b.shape[2] // cols)
    return blocks >= 2 * sms


_lock = threading.Lock()
_family_locks: dict[tuple[str, str], threading.Lock] = {}
_backends: dict[str, Backend] = {}
_warned: set[tuple[str, str]] = set()
_poison = False


def _family_lock(device_type: str, name: str) -> threading.Lock:
    with _lock:
        return _family_locks.setdefault((device_type, name), threading.Lock())


def _family_or_none(device_type: str, name: str) -> Family | None:
    try:
        return family(device_type, name)
    except KeyError:
        return None


def _fallback(fam: Family, reason: str, warn_key: str) -> FamilyState:
    """The family's fallback (the reference or None), with one warning per device type and cause."""
    key = (fam.device_type, warn_key)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"semiring_ops: {reason}", RuntimeWarning, stacklevel=5)
    if fam.name in _REFERENCE_FAMILIES:
        return FamilyState("reference", reference, reason)
    return FamilyState("none", None, reason)


def _toolchain_problem(device_type: str) -> tuple[str, str] | None:
    """(reason, warn key) when this device type's kernels cannot be compiled here at all, else None."""
    if toolkit.cxx_compiler() is None:
        return toolkit.missing_compiler_reason(device_type), "compiler"
    if device_type == "cuda" and toolkit.find_cuda_toolkit(jit.cache_root()) is None:
        return toolkit.missing_toolkit_reason(jit.cache_root()), "toolkit"
    return None


def _device_index(device_type: str) -> int | None:
    """The GPU a CUDA family's prebuilt code must run on (the current one), None without one."""
    return torch.cuda.current_device() if device_type == "cuda" and torch.cuda.is_available() else None


def _load_family(backend: Backend, fam: Family) -> FamilyState:
    if backend.forced:  # chosen, not a failure: no warning
        if fam.name in _REFERENCE_FAMILIES:
            return FamilyState("reference", reference, backend.forced)
        return FamilyState("none", None, backend.forced)
    module = prebuilt.load_prebuilt(fam, _device_index(fam.device_type))
    if module is not None:
        return FamilyState("prebuilt", module, getattr(module, "__file__", "") or "")
    spec = fam.spec()
    tk = toolkit.find_cuda_toolkit(jit.cache_root()) if fam.device_type == "cuda" else None
    if not jit.is_cached(spec, tk):
        problem = _toolchain_problem(fam.device_type)
        if problem is not None:
            return _fallback(fam, *problem)
    try:
        module = jit.load(spec, tk)
    except Exception as exc:
        first = str(exc).strip().splitlines()
        reason = (
            f"building the {fam.device_type} {fam.name} kernels failed: {first[0] if first else exc!r}; "
            f"{'the PyTorch reference runs' if fam.name in _REFERENCE_FAMILIES else 'PyTorch code runs'} instead "
            f"(SEMIRING_OPS_VERBOSE_BUILD=1 shows the compiler's output)"
        )
        return _fallback(fam, reason, f"build {fam.name}")
    return FamilyState("compiled", module, getattr(module, "__file__", "") or "")


def _forced_reason(device_type: str) -> str:
    if os.environ.get("SEMIRING_OPS_BACKEND", "auto") == "reference":
        return "SEMIRING_OPS_BACKEND=reference"
    if device_type == "cuda" and torch.version.cuda is None:
        return "this torch build has no CUDA"
    if device_type not in ("cpu", "cuda"):
        return f"no compiled kernels for device type {device_type!r}"
    return ""


def _expected_kind(backend: Backend) -> str:
    if backend.forced:
        return "reference"
    fams = families_for(backend.device_type)
    if fams and all(prebuilt.prebuilt_status(f, _device_index(f.device_type))[0] == "prebuilt" for f in fams):
        return "prebuilt"
    return "reference" if _toolchain_problem(backend.device_type) else "compiled"


def backend_for(device: torch.device) -> Backend:
    """The backend for `device`'s type (families loaded on first use), cached."""
    key = device.type
    backend = _backends.get(key)
    if backend is None:
        with _lock:
            backend = _backends.get(key)
            if backend is None:
                backend = _backends[key] = Backend(key, forced=_forced_reason(key))
    return backend


def family_status(device_type: str, name: str) -> tuple[str, str]:
    """(kind, detail) of a family without building or loading anything: loaded (its kind), prebuilt, cached,
    not built yet, or the reference with the reason."""
    fam = family(device_type, name)
    backend = _backends.get(device_type)
    if backend is not None and name in backend.families:
        state = backend.families[name]
        return state.kind, state.detail
    forced = _forced_reason(device_type)
    if forced:
        return "reference", forced
    status, detail = prebuilt.prebuilt_status(fam, _device_index(device_type))
    if status == "prebuilt":
        return "prebuilt", detail
    tk = toolkit.find_cuda_toolkit(jit.cache_root()) if device_type == "cuda" else None
    spec = fam.spec()
    if jit.is_cached(spec, tk):
        return "compiled", f"cached in {jit.build_directory(spec, tk)}"
    problem = _toolchain_problem(device_type)
    if problem is not None:
        return ("reference" if name in _REFERENCE_FAMILIES else "none"), problem[0]
    note = f" ({detail})" if status == "mismatch" else ""
    return "not built", f"compiles on first use{note}"


def set_poison_outputs(enabled: bool) -> None:
    """Testing aid: compiled kernels allocate outputs filled with NaN (indices with -1) instead of
    uninitialised memory, so an element a kernel fails to write cannot pass for a right answer."""
    global _poison
    _poison = enabled
    for backend in _backends.values():
        for state in backend.families.values():
            setter = getattr(state.module, "set_poison_outputs", None)
            if setter is not None and state.kind != "reference":
                setter(enabled)


def loaded_backends() -> dict[str, Backend]:
    return dict(_backends)


def reset() -> None:
    """Forget the chosen backends and warnings (tests use it to re-run the choice)."""
    with _lock:
        _backends.clear()
        _warned.clear()


def reference_backend(device_type: str, reason: str) -> Backend:
    """A backend that serves every family with the reference (tests force it)."""
    return Backend(device_type, forced=reason)
