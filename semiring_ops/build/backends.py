"""Which implementation of the kernel entry points (csrc/ops.h) runs on each device type, family by family.

A Backend serves one device type. Each kernel family (families.py) is loaded the first time one of its entry
points is called: the wheel's prebuilt module when it matches this torch (prebuilt.py), else the JIT build from
the cache, compiled then if needed (jit.py; CUDA with the toolkit toolkit.py finds). A family that cannot be had
falls back: the bmm and chain families to the blocked PyTorch reference (build/reference.py), the
others to None, which their callers replace with PyTorch code or the generic path. One warning per device type
says why, what it costs and the fix (a missing compiler or CUDA toolkit), or one per family whose build failed.

On the CPU the bmm and chain families' C++ autograd nodes are modules of their own (families.py, "autograd
modules"): loaded with the kernels when prebuilt or cached, else built by a worker process at low priority while the
registered operators' Python autograd formulas serve (their reference: same kernels, a few microseconds more of
host time per call), then loaded and attached to the kernels' module (csrc/bindings/kernel_table.h).

Environment: SEMIRING_OPS_BACKEND=reference forces the reference everywhere. SEMIRING_OPS_AUTOGRAD_BUILD=background
(default) | now (build an autograd module in the call that first needs it) | off (the Python formulas only).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from ..semirings import MaxSemiring, MinSemiring
from . import jit, nvrtc_kernels, prebuilt, reference, toolkit
from .families import ExtensionSpec, Family, families_for, family
from .toolkit import CudaToolkit

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
    """A loaded family: what serves it (kind: prebuilt | compiled | reference | none, or building for an autograd
    module under way), the module and a detail (the library's path, or why it fell back); `build`, the worker
    process of an autograd module's background build."""

    kind: str
    module: Any
    detail: str = ""
    build: Any = None


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
                elif fam.autograd_of:  # loaded for its kernels' module, and attached to it
                    kernels = self.family(fam.autograd_of)
                    state = (
                        _start_autograd_module(self, fam, kernels)
                        if hasattr(kernels, "kernel_table")
                        else FamilyState("none", None, f"the {fam.autograd_of} family is not compiled here")
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
        will (reference only when forced or no compiler can build them; mixed where only the families with an NVRTC
        route can be)."""
        kinds = {s.kind for s in self.families.values() if s.kind not in ("none", "building")}
        if len(kinds) == 1:
            return kinds.pop()
        if kinds:
            return "mixed"
        return _expected_kind(self)

    @property
    def detail(self) -> str:
        return self.forced or "; ".join(f"{n}: {s.kind} {s.detail}" for n, s in self.families.items())

    def autograd_node(self, family: str, name: str, wait: bool = False) -> Any:
        """The family's C++ autograd entry point `name` (csrc/autograd/autograd.h: a kernel recorded with its
        backward as one node), or None where the family has none (the PyTorch reference) or, on the CPU, while its
        autograd module is built in the background (`wait`: wait for that build): the caller then records the
        registered operator, whose Python autograd formula is the node's reference."""
        kernels = self.family(family)
        companion = _family_or_none(self.device_type, f"{family}_autograd")
        if companion is None or not hasattr(kernels, "kernel_table"):
            return getattr(kernels, name, None)
        state = self.families.get(companion.name)
        if state is None or (wait and state.kind == "building"):
            state = self._autograd_module(companion, kernels, wait)
        return getattr(state.module, name, None)

    def _autograd_module(self, fam: Family, kernels: Any, wait: bool) -> FamilyState:
        with _family_lock(self.device_type, fam.name):
            state = self.families.get(fam.name)
            if state is None:
                state = self.families[fam.name] = _start_autograd_module(self, fam, kernels)
            if state.kind == "building" and wait:
                state.build.wait()
                state = _finish_autograd_build(self, fam, kernels, state)
        return state

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


def _toolchain_problem(device_type: str, nvrtc: bool = False) -> tuple[str, str] | None:
    """(reason, warn key) when this device type's kernels (on the NVRTC route: a family's host code) cannot be
    compiled here at all, else None."""
    if toolkit.cxx_compiler() is None:
        return toolkit.missing_compiler_reason(device_type), "compiler"
    if device_type == "cuda" and not nvrtc and toolkit.find_cuda_toolkit(jit.cache_root()) is None:
        return toolkit.missing_toolkit_reason(jit.cache_root()), "toolkit"
    return None


def jit_build(fam: Family, building: bool = False) -> tuple[ExtensionSpec, CudaToolkit | None]:
    """The JIT build of `fam` and the toolkit it needs: the family's nvcc build with the CUDA toolkit found, or for a
    CUDA family that has one, the NVRTC route's host code where no toolkit is found and NVRTC serves
    ($SEMIRING_OPS_CUDA_KERNELS: nvrtc prefers it, nvcc never takes it; nvrtc_kernels.route_choice). `building`
    (a build for later, parallel.py: `python -m semiring_ops build`, a wheel's): the host code needs only the CUDA
    runtime's headers, not the GPU and NVRTC that its kernels need when they run."""
    if fam.device_type != "cuda":
        return fam.spec(), None
    tk = toolkit.find_cuda_toolkit(jit.cache_root())
    choice = nvrtc_kernels.route_choice()
    wanted = choice == "nvrtc" or (choice == "auto" and tk is None)
    serves = nvrtc_kernels.cuda_runtime_paths() is not None if building else nvrtc_kernels.route_problem() is None
    if fam.nvrtc and wanted and serves:
        return fam.spec(nvrtc=True), None
    return fam.spec(), tk


def _jit_load(spec: ExtensionSpec, tk: CudaToolkit | None) -> Any:
    module = jit.load(spec, tk)
    return _with_kernel_source(module) if spec.nvrtc else module


def _with_kernel_source(module: Any) -> Any:
    """An NVRTC-route module (JIT-built or a wheel's): its kernels compile on their first launch, through this
    process's NVRTC route."""
    module.set_kernel_source(nvrtc_kernels.kernel_handle)
    return module


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
        if prebuilt.takes_nvrtc(fam):
            module = _with_kernel_source(module)
        return FamilyState("prebuilt", module, getattr(module, "__file__", "") or "")
    spec, tk = jit_build(fam)
    if not jit.is_cached(spec, tk):
        problem = _toolchain_problem(fam.device_type, spec.nvrtc)
        if problem is not None:
            return _fallback(fam, *problem)
    try:
        module = _jit_load(spec, tk)
    except Exception as exc:
        first = str(exc).strip().splitlines()
        reason = (
            f"building the {fam.device_type} {fam.name} kernels failed: {first[0] if first else exc!r}; "
            f"{'the PyTorch reference runs' if fam.name in _REFERENCE_FAMILIES else 'PyTorch code runs'} instead "
            f"(SEMIRING_OPS_VERBOSE_BUILD=1 shows the compiler's output)"
        )
        return _fallback(fam, reason, f"build {fam.name}")
    return FamilyState("compiled", module, getattr(module, "__file__", "") or "")


# ---------------------------------------------------------------- the CPU autograd modules

_AUTOGRAD_BUILD = ("background", "now", "off")


def _autograd_build_mode() -> str:
    mode = os.environ.get("SEMIRING_OPS_AUTOGRAD_BUILD", "background")
    if mode not in _AUTOGRAD_BUILD:
        raise ValueError(f"SEMIRING_OPS_AUTOGRAD_BUILD must be one of {', '.join(_AUTOGRAD_BUILD)}, got {mode!r}")
    return mode


def _attached(kind: str, module: Any, kernels: Any) -> FamilyState:
    module.attach(kernels.kernel_table())
    module.set_poison_outputs(_poison)
    return FamilyState(kind, module, getattr(module, "__file__", "") or "")


def _start_autograd_module(backend: Backend, fam: Family, kernels: Any) -> FamilyState:
    """The autograd module `fam` for the loaded `kernels`: prebuilt or cached (loaded now), built now, or a worker
    process building it (kind "building", with a thread that loads it when the worker ends)."""
    module = prebuilt.load_prebuilt(fam, None)
    if module is not None:
        return _attached("prebuilt", module, kernels)
    spec = fam.spec()
    mode = _autograd_build_mode()
    python = "the Python autograd formulas serve"
    if not jit.is_cached(spec):
        if mode == "off":
            return FamilyState("none", None, f"SEMIRING_OPS_AUTOGRAD_BUILD=off: {python}")
        problem = _toolchain_problem(fam.device_type)
        if problem is not None:
            return FamilyState("none", None, f"{problem[0]}; {python}")
        if mode == "background":
            from .parallel import start_background_build

            state = FamilyState("building", None, f"compiling in the background; {python}")
            jit.build_directory(spec).mkdir(parents=True, exist_ok=True)  # a folder without its marker: under way
            state.build = start_background_build(fam)
            print(
                f"semiring_ops: compiling the CPU {fam.autograd_of} family's C++ autograd nodes in the background "
                f"(meanwhile {python}) into {jit.build_directory(spec)}",
                file=sys.stderr,
                flush=True,
            )
            threading.Thread(
                target=_finish_when_built,
                args=(backend, fam, kernels, state),
                name=f"semiring_ops {fam.key}",
                daemon=True,
            ).start()
            return state
    try:
        return _attached("compiled", jit.load(spec), kernels)
    except Exception as exc:
        return _autograd_fallback(fam, f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}")


def _autograd_fallback(fam: Family, why: str) -> FamilyState:
    reason = (
        f"building the CPU {fam.autograd_of} family's autograd module failed: {why}; the Python autograd formulas "
        "serve (SEMIRING_OPS_VERBOSE_BUILD=1 shows the compiler's output)"
    )
    key = (fam.device_type, f"build {fam.name}")
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"semiring_ops: {reason}", RuntimeWarning, stacklevel=6)
    return FamilyState("none", None, reason)


def _finish_when_built(backend: Backend, fam: Family, kernels: Any, state: FamilyState) -> None:
    state.build.wait()
    with _family_lock(backend.device_type, fam.name):
        _finish_autograd_build(backend, fam, kernels, state)


def _finish_autograd_build(backend: Backend, fam: Family, kernels: Any, state: FamilyState) -> FamilyState:
    """Once `state`'s worker has ended (the caller holds the family's lock): the module loaded and attached, or the
    fallback with the worker's last line; the first of the waiting caller and the watching thread does it."""
    current = backend.families.get(fam.name)
    if current is not state:
        return current
    proc = state.build
    proc.log.seek(0)
    err = proc.log.read().strip().splitlines()
    proc.log.close()
    if proc.returncode != 0:
        new = _autograd_fallback(fam, f"exit {proc.returncode}: {err[-1] if err else ''}")
    else:
        try:
            new = _attached("compiled", jit.load(fam.spec()), kernels)
        except Exception as exc:
            new = _autograd_fallback(fam, repr(exc))
    backend.families[fam.name] = new
    return new


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
    kinds = set()
    for fam in fams:  # a CUDA family may take the NVRTC route where no toolkit builds the others
        spec, _ = jit_build(fam)
        kinds.add("reference" if _toolchain_problem(fam.device_type, spec.nvrtc) else "compiled")
    return kinds.pop() if len(kinds) == 1 else "mixed"


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


_NVRTC_NOTE = " (NVRTC route: kernels compile on their first launch)"  # family_status's detail of such a module


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
        return "prebuilt", detail + (_NVRTC_NOTE if prebuilt.takes_nvrtc(fam) else "")
    spec, tk = jit_build(fam)
    route = _NVRTC_NOTE if spec.nvrtc else ""
    if jit.is_cached(spec, tk):
        return "compiled", f"cached in {jit.build_directory(spec, tk)}{route}"
    problem = _toolchain_problem(device_type, spec.nvrtc)
    if problem is not None:
        return ("reference" if name in _REFERENCE_FAMILIES else "none"), problem[0]
    note = f" ({detail})" if status == "mismatch" else ""
    return "not built", f"compiles on first use{note}{route}"


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
