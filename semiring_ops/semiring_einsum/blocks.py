"""Compiled equations and block sizes, torch-semiring-einsum's way of bounding memory, as semiring_ops reads them.

``block_size`` (an int, or an AutomaticBlockSize) becomes a memory budget: for the fused einsum
(semiring_ops.einsum) the bound on its intermediates, for the generic engine (generic.py) the size of the blocks of
terms it builds at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..einsum.equation import BoundEquation, bind, parse

__all__ = ["AUTOMATIC_BLOCK_SIZE", "AutomaticBlockSize", "Equation", "budget_bytes", "compile_equation"]


class Equation:
    """An equation compiled once (torch.einsum's grammar: explicit or implicit output, '...', repeated labels);
    the einsum functions bind it to their operands' shapes."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.parsed = parse(source)

    def bind(self, args: Sequence[Tensor]) -> BoundEquation:
        return bind(self.parsed, [tuple(t.shape) for t in args])

    # torch-semiring-einsum precomputes lookup tables in these; semiring_ops has none to prepare
    def prepare_for_forward(self) -> None:
        """Nothing to prepare (kept for code that calls it)."""

    def prepare_for_backward(self) -> None:
        """Nothing to prepare (kept for code that calls it)."""

    def prepare_for_log_backward(self) -> None:
        """Nothing to prepare (kept for code that calls it)."""

    def __repr__(self) -> str:
        return f"Equation({self.source!r})"


def compile_equation(equation: str) -> Equation:
    """The equation, parsed once: ValueError naming what is malformed."""
    return Equation(equation)


class AutomaticBlockSize:
    """A memory budget from the memory available: ``max_cpu_bytes`` on the CPU; on a GPU ``max_cuda_bytes``, or
    the free memory (PyTorch's cached blocks counted free), times ``cuda_memory_proportion`` when cached."""

    def __init__(
        self,
        max_cpu_bytes: int = 1 << 30,
        max_cuda_bytes: int | None = None,
        cache_available_cuda_memory: bool = True,
        cuda_memory_proportion: float = 0.8,
        repr_string: str | None = None,
    ) -> None:
        self.max_cpu_bytes = max_cpu_bytes
        self.max_cuda_bytes = max_cuda_bytes
        self.cache_available_cuda_memory = cache_available_cuda_memory
        self.cuda_memory_proportion = cuda_memory_proportion
        self.available_cuda_memory: dict[int | None, int] = {}
        self.repr_string = repr_string

    def available_bytes(self, device: torch.device) -> int:
        if device.type == "cpu":
            return self.max_cpu_bytes
        if device.type != "cuda":
            raise ValueError(f"unrecognized device type: {device!r}")
        if self.max_cuda_bytes is not None:
            return self.max_cuda_bytes
        if not self.cache_available_cuda_memory:
            return _free_cuda_bytes(device)
        if device.index not in self.available_cuda_memory:
            self.available_cuda_memory[device.index] = round(self.cuda_memory_proportion * _free_cuda_bytes(device))
        return self.available_cuda_memory[device.index]

    def __repr__(self) -> str:
        return self.repr_string if self.repr_string is not None else super().__repr__()


AUTOMATIC_BLOCK_SIZE = AutomaticBlockSize(repr_string="AUTOMATIC_BLOCK_SIZE")


def _free_cuda_bytes(device: torch.device) -> int:
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def budget_bytes(block_size, bound: BoundEquation, args: Sequence[Tensor], output_bytes_per_element: int) -> int:
    """The memory budget `block_size` stands for, in bytes: an int b allows what its blocks of terms would hold
    (the output times b per summed label, of the operands' element size); an AutomaticBlockSize the memory it
    finds, less twice the output (the result and one block's sum)."""
    element = args[0].element_size() if args else 4
    output = math.prod(bound.sizes[lab] for lab in bound.output)
    if isinstance(block_size, bool) or not isinstance(block_size, (int, AutomaticBlockSize)):
        raise ValueError(f"unrecognized block_size: {block_size!r}")
    if isinstance(block_size, int):
        if block_size < 1:
            raise ValueError(f"block_size must be a positive int or an AutomaticBlockSize, got {block_size}")
        return max(1, output) * block_size ** len(bound.summed) * element
    device = args[0].device if args else torch.device("cpu")
    return max(element, block_size.available_bytes(device) - 2 * output * output_bytes_per_element)
