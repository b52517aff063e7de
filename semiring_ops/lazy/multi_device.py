"""Lazy reductions spread over several devices of one process: ``K.sum(1, devices=["cuda:0", "cuda:1"])``.

The output axis (i when reducing over j, j when reducing over i) is cut into one band per device
(devices.split_bands: sizes differing by at most one); each device reduces its band with the
one-device kernels, from its own thread (so the GPUs run at once), on copies of the band's rows of the
output-axis variables and of every other tensor of the formula (each tensor copied once per device, every
copy queued before any kernel); the bands' results come back to the formula's device and are concatenated.
Nothing is combined across devices: every output row is reduced on one device over the whole reduced axis,
so values and indices are the one-device answer, for every reduction (sum, logsumexp, max / min and their arg
forms, K best, weighted logsumexp). Gradients flow back through the copies (torch's autograd runs each
device's backward on that device). ``devices``: a list of devices (``"cpu"`` counts: the CPU path of the same
code), or ``"all"`` for every visible GPU.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import torch

from ..devices import resolve_devices, split_bands
from .autograd import Extent, reduce_formula
from .formula import Formula, Var, substitute, variables
from .reductions import Reduction

__all__ = ["reduce_on_devices", "resolve"]


def resolve(devices: Sequence[Any] | str, what: str) -> list[torch.device]:
    """The devices of ``devices=``: "all" is every visible GPU; a list names devices (ints: CUDA indices)."""
    if devices == "all" and not torch.cuda.is_available():
        raise ValueError(f"{what}: devices='all' asks for every visible GPU, and none is available")
    try:
        return resolve_devices(devices)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _band(formula: Formula, outer: str, n_outer: int, r0: int, r1: int, device: torch.device) -> Formula:
    """The formula with its ``outer`` variables' rows [r0, r1) and every tensor on ``device`` (each tensor
    copied once, so that a variable used twice stays one kernel argument)."""
    done: list[tuple[torch.Tensor, torch.Tensor]] = []

    def cut(v: Var) -> Formula:
        for old, new in done:
            if old is v.tensor:
                return Var(v.cat, v.dim, tensor=new)
        t = v.tensor
        if v.cat == outer and t.shape[-2] == n_outer:  # (rows of 1 broadcast: kept whole)
            t = t[..., r0:r1, :]
        new = t.to(device)
        done.append((v.tensor, new))
        return Var(v.cat, v.dim, tensor=new)

    return substitute(formula, cut)


def reduce_on_devices(
    formula: Formula,
    reduction: Reduction,
    outer: str,
    extent: Extent,
    with_arg: bool,
    devices: list[torch.device],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """reduce_formula's (values, indices) with the ``outer`` axis cut over ``devices`` (module docstring), on
    the formula's device."""
    home = next(v.tensor.device for v in variables(formula) if v.tensor is not None)
    n_outer = extent.rows(outer)
    count = min(len(devices), n_outer)
    if count <= 1:
        if not devices or devices[0] == home or n_outer == 0:
            return reduce_formula(formula, reduction, outer, extent, with_arg)
        count = 1
    bands = split_bands(n_outer, count)
    results: list[tuple[torch.Tensor, torch.Tensor | None] | None] = [None] * count
    errors: list[BaseException] = []
    grad_mode = torch.is_grad_enabled()  # grad mode is per thread: the workers take the caller's

    def on(dev: torch.device) -> contextlib.AbstractContextManager:
        return torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()

    # Every band's copies are queued here, before any kernel: a copy from the home device runs on the home
    # device's stream, so a copy queued after the home band's kernel would wait for that kernel to finish and
    # the devices would take turns (measured: 2 H100s no faster than one).
    parts = []
    for dev, (r0, r1) in zip(devices[:count], bands, strict=True):
        with on(dev):
            parts.append(_band(formula, outer, n_outer, r0, r1, dev))

    def work(t: int) -> None:
        dev, (r0, r1) = devices[t], bands[t]
        try:
            with on(dev), torch.set_grad_enabled(grad_mode):
                part = parts[t]
                sizes = (r1 - r0, extent.n_j) if outer == "i" else (extent.n_i, r1 - r0)
                vals, idx = reduce_formula(part, reduction, outer, Extent(extent.batch, *sizes), with_arg)
                results[t] = (vals.to(home), None if idx is None else idx.to(home))
        except BaseException as exc:  # raised in the caller's thread below
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(t,), name=f"semiring_ops.lazy {devices[t]}") for t in range(1, count)
    ]
    for th in threads:
        th.start()
    work(0)
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    vals = torch.cat([r[0] for r in results], -2)  # type: ignore[index]
    idx = torch.cat([r[1] for r in results], -2) if results[0][1] is not None else None  # type: ignore[index]
    return vals, idx
