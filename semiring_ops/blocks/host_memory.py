"""Host outputs for the block engine: memory whose first touch is cheap.

A fresh output of tens of GB is mostly page faults: every 4 KiB page is faulted in, zeroed and mapped by the
kernel the first time a block is written into it (on an H100 machine's 16 cores, 19 GB/s for a first-touch
copy against 38 GB/s into pre-faulted memory). :func:`empty` asks Linux for transparent huge pages
(``madvise(MADV_HUGEPAGE)`` on an anonymous mapping), so pages fault in 2 MiB at a time (29 GB/s there). On
other systems, for small outputs, or where the kernel refuses, it is ``torch.empty``.
"""

from __future__ import annotations

import math
import mmap

import torch

__all__ = ["HUGE_PAGE_MIN_BYTES", "empty"]

HUGE_PAGE_MIN_BYTES = 64 << 20  # smaller outputs: torch.empty (its first touch costs milliseconds)


def empty(shape: tuple[int, ...] | list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised, contiguous CPU tensor of ``shape`` and ``dtype`` for a block engine output (what
    blocks.dense / pdist / matmul allocate when given no ``out``): backed by an anonymous memory mapping with
    transparent huge pages requested, when the output has at least HUGE_PAGE_MIN_BYTES and the system offers
    ``MADV_HUGEPAGE``; else ``torch.empty``. The memory is returned to the system when the tensor (its
    storage) is freed."""
    shape = tuple(int(s) for s in shape)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes < HUGE_PAGE_MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype)
    try:
        buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buffer.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):  # no such mapping here, or THP disabled: ordinary pages
        return torch.empty(shape, dtype=dtype)
    # the tensor holds a reference to the mapping (torch.frombuffer), which unmaps when the storage dies
    return torch.frombuffer(buffer, dtype=dtype).view(shape)
