"""The devices a call runs on, and the even split of an extent across them: the lowest layer that the block
engine (blocks/) and the lazy reductions' multi-device path (lazy/multi_device.py) share."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

__all__ = ["cpu_workers", "resolve_devices", "split_bands"]


def cpu_workers() -> list[torch.device]:
    """The CPU path's workers: one per 2 cores, at most 4 (each block's torch operations are multi-threaded)."""
    return [torch.device("cpu")] * max(1, min(4, (os.cpu_count() or 1) // 2))


def resolve_devices(devices: Sequence[torch.device | str | int] | str | None) -> list[torch.device]:
    """``None``: every visible GPU, or without one the CPU (one worker per 2 cores, at most 4: each block's
    torch operations are multi-threaded already); ``"all"``: every visible GPU; else the list (ints are CUDA
    indices; ``"cpu"`` twice is two CPU workers). Raises ValueError for a device that is not there."""
    if devices is None or devices == "all":
        if torch.cuda.is_available():
            return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        if devices == "all":
            raise ValueError("devices='all' asks for every visible GPU, and none is available")
        return cpu_workers()
    if isinstance(devices, (str, int, torch.device)):
        devices = [devices]
    out = []
    for d in devices:
        try:
            dev = torch.device("cuda", d) if isinstance(d, int) else torch.device(d)
        except (RuntimeError, TypeError):
            raise ValueError(f"devices: {d!r} is not a device (e.g. 'cuda:1', 1 or 'cpu')") from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"devices: {dev} asked for, and no CUDA GPU is available")
            index = torch.cuda.current_device() if dev.index is None else dev.index
            if index >= torch.cuda.device_count():
                raise ValueError(f"devices: {dev}, but there are {torch.cuda.device_count()} CUDA devices")
            dev = torch.device("cuda", index)
        elif dev.type != "cpu":
            raise ValueError(f"devices: {dev} is neither a CUDA device nor the CPU")
        out.append(dev)
    if not out:
        raise ValueError("devices: an empty list")
    return out


def split_bands(extent: int, count: int) -> tuple[tuple[int, int], ...]:
    """Cuts [0, extent) into ``count`` bands (start, stop) whose sizes differ by at most one, the longer
    first: ``extent % count`` bands of ``extent // count + 1``, then ``extent // count``. Needs
    0 < count <= extent (extent = 0 with count = 0 gives no bands)."""
    for name, value in (("extent", extent), ("count", count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}={value!r} must be an int >= 0")
    if extent == 0 and count == 0:
        return ()
    if not 0 < count <= extent:
        raise ValueError(f"count={count} must be in [1, extent={extent}] (each band holds at least one index)")
    size, extra = divmod(extent, count)
    bands = []
    start = 0
    for b in range(count):
        stop = start + size + (1 if b < extra else 0)
        bands.append((start, stop))
        start = stop
    return tuple(bands)
