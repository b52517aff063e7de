"""The block scheduler of the block engine: how an (M, N) output is cut into blocks, in pure Python.

An output of shape (M, N) or (M, N, D) (rows x columns x a trailing value dim D, each value ``elem_bytes``
bytes) is cut into a 2-D grid of blocks: ``row_bands`` x ``col_bands``, each band a half-open range of
indices. The planning functions take the device's numbers (free memory, SM count) as arguments and never ask
a device, so a plan can be made and checked on a CPU.

The rules (:func:`plan_blocks` applies them in this order):

1. **Budget.** ``budget = 0.8 * free_bytes`` (integer: ``free_bytes * 4 // 5``), or ``max_device_bytes`` when
   only that is given, or the smaller of the two when both are. Half the budget is for the output buffers
   and half for the operands. The pipeline keeps two output buffers per GPU (double buffering: one block
   is copied out while the next is computed), so **one block's output buffer, rows x cols x D x elem_bytes
   bytes, must fit in ``budget // 4``**, and **one block's operand slices, rows x operand_row_bytes +
   cols x operand_col_bytes, must fit in ``budget // 2``**. A diagonal block of the triangle modes is
   budgeted as the whole rows x cols rectangle. With several GPUs the budget is per GPU: pass the smallest
   free memory among them.
2. **Memory limit on the side.** ``side_limit`` is the largest s for which an s x s block, clipped to the
   output (min(s, M) x min(s, N)), meets both memory rules. If not even a 1 x 1 block does (a budget too
   small for one row and one column), :class:`ValueError`.
3. **Split hint.** About ``blocks_per_gpu`` (32) blocks per GPU, so a pool of ``n_gpus`` GPUs can balance
   them as they free up: ``hint_side`` is the smallest s whose grid, ceil(M / s) x ceil(N / s) blocks (in a
   triangle mode k (k + 1) / 2 with k = ceil(N / s)), has at most ``blocks_per_gpu * n_gpus`` blocks.
4. **SM floor.** So that one launch fills the GPU, every band is at least ``min_side = sm_count *
   rows_per_sm`` long (or the whole extent when that is shorter).
5. **Band counts.** Along an extent E (M for rows, N for columns): ``k = max(ceil(E / side_limit),
   min(ceil(E / hint_side), max(1, E // min_side)))``. The memory rule wins over the SM floor, which wins
   over the hint: bands are never longer than ``side_limit``, and shorter than ``min_side`` only when memory
   needs it.
6. **Bands.** E is split into k bands whose sizes differ by at most one, the longer bands first
   (:func:`semiring_ops.devices.split_bands`): ``E % k`` bands of ``E // k + 1``, then bands of ``E // k``.

7. **Full rows** (``full_rows=True``, full outputs only). When a band of ``min(M, min_side)`` whole rows
   (all N columns) meets rule 1, the rows are cut into ``k = max(ceil(M / row_cap), min(target, max(1,
   M // min_side)))`` bands of whole rows instead (row_cap: the most whole rows rule 1 allows), and there is
   one column band: each block is then one contiguous range of a row-major output, which the block engine
   downloads and writes in a few large copies.

Triangle modes, for symmetric outputs such as pdist's (M = N = n, the same bands for rows and columns):
``triangle="lower"`` keeps the blocks on or below the diagonal (row band >= column band) and
``triangle="upper"`` those on or above it; the blocks wholly on the other side are skipped. A block on the
diagonal (``on_diagonal``) is kept whole and its kernel writes only the cells of its side: with
``diagonal=False`` the cells strictly below (lower: column < row) or above (upper: column > row) the
diagonal, with ``diagonal=True`` those and the diagonal's. By symmetry a lower cell (r, c) is the pair
(i, j) = (c, r), so both modes cover each pair i < j (i <= j with the diagonal) exactly once; an upper
block's row r holds consecutive entries of the condensed layout (:func:`condensed_index`), a lower block's
column c does.

A block's ``work`` is the number of cells its kernel computes (rows x cols, or the triangle's part of a
diagonal block); blocks of no work (1 x 1 diagonal blocks without the diagonal) are not listed. The blocks
are sorted by work, largest first (ties in row band, then column band order), so a multi-GPU pool takes the
biggest first, and ``index`` is a block's position in that order. An empty output (M = 0 or N = 0) gives a
plan with no bands and no blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..devices import split_bands

__all__ = [
    "BLOCKS_PER_GPU",
    "ROWS_PER_SM",
    "Block",
    "BlockGrid",
    "condensed_index",
    "condensed_row_start",
    "condensed_size",
    "plan_blocks",
    "split_bands",
]

BLOCKS_PER_GPU = 32  # the split hint: about this many blocks per GPU
ROWS_PER_SM = 8  # the SM floor: a band is at least sm_count * ROWS_PER_SM long

Triangle = Literal["lower", "upper"]


@dataclass(frozen=True)
class Block:
    """One block: output rows [r0, r1) x columns [c0, c1).

    ``index`` is its position in :attr:`BlockGrid.blocks` (the dispatch order, largest work first);
    ``row_band`` and ``col_band`` its bands' positions in the grid; ``work`` the cells its kernel computes;
    ``on_diagonal`` whether it is a diagonal block of a triangle mode (whose kernel writes only its side of
    the diagonal; always False for a full grid)."""

    index: int
    row_band: int
    col_band: int
    r0: int
    r1: int
    c0: int
    c1: int
    work: int
    on_diagonal: bool

    @property
    def rows(self) -> int:
        return self.r1 - self.r0

    @property
    def cols(self) -> int:
        return self.c1 - self.c0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)


@dataclass(frozen=True)
class BlockGrid:
    """A plan: the bands of an (M, N[, D]) output and its blocks in dispatch order (see the module's rules).

    ``row_bands`` / ``col_bands``: (start, stop) pairs covering [0, M) / [0, N) in order; ``blocks``: the
    kept blocks, largest work first. ``budget_bytes`` is the budget of rule 1, ``side_limit``,
    ``hint_side`` and ``min_side`` the sides of rules 2 to 4 (all 0 for an empty output)."""

    m: int
    n: int
    value_dim: int
    elem_bytes: int
    triangle: Triangle | None
    diagonal: bool
    budget_bytes: int
    operand_row_bytes: int
    operand_col_bytes: int
    side_limit: int
    hint_side: int
    min_side: int
    target_blocks: int
    row_bands: tuple[tuple[int, int], ...]
    col_bands: tuple[tuple[int, int], ...]
    blocks: tuple[Block, ...]

    @property
    def output_cap_bytes(self) -> int:
        """The most bytes one block's output buffer may take: ``budget_bytes // 4``."""
        return self.budget_bytes // 4

    @property
    def operand_cap_bytes(self) -> int:
        """The most bytes one block's operand slices may take: ``budget_bytes // 2``."""
        return self.budget_bytes // 2

    def block_output_bytes(self, block: Block) -> int:
        """The bytes of a block's output buffer: rows x cols x D x elem_bytes (whole, on the diagonal too)."""
        return block.rows * block.cols * self.value_dim * self.elem_bytes

    def block_operand_bytes(self, block: Block) -> int:
        """The bytes of a block's operand slices: rows x operand_row_bytes + cols x operand_col_bytes."""
        return block.rows * self.operand_row_bytes + block.cols * self.operand_col_bytes

    @property
    def covered_cells(self) -> int:
        """The cells the blocks compute: the sum of their work."""
        return sum(b.work for b in self.blocks)

    @property
    def output_cells(self) -> int:
        """The cells of the output: M x N, or n (n - 1) / 2 (n (n + 1) / 2 with the diagonal) in a triangle
        mode. A plan covers them exactly once, so this equals :attr:`covered_cells`."""
        if self.triangle is None:
            return self.m * self.n
        return condensed_size(self.n, self.diagonal)


def plan_blocks(
    m: int,
    n: int,
    *,
    value_dim: int = 1,
    elem_bytes: int = 4,
    free_bytes: int | None = None,
    max_device_bytes: int | None = None,
    sm_count: int,
    n_gpus: int = 1,
    blocks_per_gpu: int = BLOCKS_PER_GPU,
    rows_per_sm: int = ROWS_PER_SM,
    operand_row_bytes: int = 0,
    operand_col_bytes: int = 0,
    triangle: Triangle | None = None,
    diagonal: bool = False,
    full_rows: bool = False,
) -> BlockGrid:
    """Plans the blocks of an (m, n[, value_dim]) output of ``elem_bytes``-byte values (module docstring:
    the rules).

    ``free_bytes``: free memory of one device (the smallest among ``n_gpus``); ``max_device_bytes``: a budget
    that replaces 0.8 x free_bytes when it is smaller (or when free_bytes is not given); one of the two is
    needed. ``sm_count``: the device's multiprocessor count. ``operand_row_bytes`` / ``operand_col_bytes``:
    the operand bytes a block needs per output row / column (e.g. d x elem_bytes for pdist's X rows), 0 for
    operands kept whole on the device (subtract them from free_bytes instead). ``triangle`` ("lower",
    "upper" or None) and ``diagonal``: the triangle modes, for square outputs only. ``full_rows`` (rule 7,
    full outputs only): bands of whole rows when they fit.
    """
    _check_int("m", m, 0)
    _check_int("n", n, 0)
    _check_int("value_dim", value_dim, 1)
    _check_int("elem_bytes", elem_bytes, 1)
    _check_int("sm_count", sm_count, 1)
    _check_int("n_gpus", n_gpus, 1)
    _check_int("blocks_per_gpu", blocks_per_gpu, 1)
    _check_int("rows_per_sm", rows_per_sm, 1)
    _check_int("operand_row_bytes", operand_row_bytes, 0)
    _check_int("operand_col_bytes", operand_col_bytes, 0)
    if triangle not in (None, "lower", "upper"):
        raise ValueError(f"triangle={triangle!r} must be 'lower', 'upper' or None")
    if not isinstance(diagonal, bool):
        raise ValueError(f"diagonal={diagonal!r} must be a bool")
    if diagonal and triangle is None:
        raise ValueError("diagonal=True needs a triangle mode (triangle='lower' or 'upper')")
    if triangle is not None and m != n:
        raise ValueError(f"triangle={triangle!r} needs a square output, got m={m}, n={n}")
    budget = _budget(free_bytes, max_device_bytes)

    def grid(side_limit: int, hint_side: int, min_side: int, target: int, rows=(), cols=(), blocks=()):
        return BlockGrid(
            m, n, value_dim, elem_bytes, triangle, diagonal, budget, operand_row_bytes, operand_col_bytes,
            side_limit, hint_side, min_side, target, tuple(rows), tuple(cols), tuple(blocks),
        )  # fmt: skip

    target = blocks_per_gpu * n_gpus
    if m == 0 or n == 0:
        return grid(0, 0, 0, target)
    cell_bytes = value_dim * elem_bytes
    longest = max(m, n)

    def fits(s: int) -> bool:  # rule 1 for an s x s block clipped to the output
        h, w = min(s, m), min(s, n)
        return h * w * cell_bytes <= budget // 4 and h * operand_row_bytes + w * operand_col_bytes <= budget // 2

    if not fits(1):
        source = "max_device_bytes" if max_device_bytes is not None else "free_bytes"
        raise ValueError(
            f"{source}: a budget of {budget} bytes is too small for one row and one column: a 1 x 1 block needs "
            f"{cell_bytes} output bytes (budget // 4 = {budget // 4}) and {operand_row_bytes + operand_col_bytes} "
            f"operand bytes (budget // 2 = {budget // 2})"
        )
    side_limit = _last_true(1, longest, fits)

    def block_count(s: int) -> int:
        if triangle is not None:
            k = -(-n // s)
            return k * (k + 1) // 2
        return -(-m // s) * -(-n // s)

    hint_side = _first_true(1, longest, lambda s: block_count(s) <= target)
    min_side = sm_count * rows_per_sm

    def bands(extent: int) -> tuple[tuple[int, int], ...]:
        k = max(-(-extent // side_limit), min(-(-extent // hint_side), max(1, extent // min_side)))
        return split_bands(extent, k)

    row_bands = bands(m)
    col_bands = row_bands if triangle is not None else bands(n)
    if full_rows and triangle is None:  # rule 7

        def row_fits(h: int) -> bool:
            return h * n * cell_bytes <= budget // 4 and h * operand_row_bytes + n * operand_col_bytes <= budget // 2

        if row_fits(min(m, min_side)):
            row_cap = _last_true(1, m, row_fits)
            k = max(-(-m // row_cap), min(target, max(1, m // min_side)))
            row_bands, col_bands = split_bands(m, k), ((0, n),)
    cells = []  # (work, row band, col band, on_diagonal)
    for i, (r0, r1) in enumerate(row_bands):
        for j, (c0, c1) in enumerate(col_bands):
            if triangle is None or ((i > j) if triangle == "lower" else (i < j)):
                cells.append((-(r1 - r0) * (c1 - c0), i, j, False))
            elif i == j:
                s = r1 - r0
                work = s * (s + 1) // 2 if diagonal else s * (s - 1) // 2
                if work:
                    cells.append((-work, i, j, True))
    cells.sort()
    blocks = [
        Block(idx, i, j, *row_bands[i], *col_bands[j], -neg_work, on_diag)
        for idx, (neg_work, i, j, on_diag) in enumerate(cells)
    ]
    return grid(side_limit, hint_side, min_side, target, row_bands, col_bands, blocks)


def condensed_size(n: int, diagonal: bool = False) -> int:
    """The length of the condensed vector of an n x n symmetric output: n (n - 1) / 2 pairs i < j (scipy's
    ``pdist``), or n (n + 1) / 2 pairs i <= j with ``diagonal=True``."""
    _check_int("n", n, 0)
    return n * (n + 1) // 2 if diagonal else n * (n - 1) // 2


def condensed_row_start(i: int, n: int, diagonal: bool = False) -> int:
    """The offset of row i's first entry in the condensed vector, for 0 <= i <= n (row n: the vector's
    length). Row i holds the pairs (i, j), j > i (j >= i with ``diagonal=True``: the diagonal first), in j
    order, so row i's entries are [condensed_row_start(i), condensed_row_start(i + 1))."""
    _check_int("n", n, 0)
    _check_int("i", i, 0)
    if i > n:
        raise ValueError(f"i={i} must be in [0, n={n}]")
    return row_start(i, n, diagonal)


def row_start(i, n: int, diagonal: bool = False):
    """condensed_row_start's arithmetic, unchecked: for an int i, or elementwise for an int64 tensor of rows
    (writers.CondensedWriter places a whole block's cells with it)."""
    return n * i - i * (i - 1) // 2 if diagonal else n * i - i * (i + 1) // 2


def condensed_index(i: int, j: int, n: int, diagonal: bool = False) -> int:
    """The position of pair (i, j) in the condensed vector of an n x n symmetric output, rows i in order and
    the pairs of a row in j order: scipy.spatial.distance.pdist's layout (0 <= i < j < n), or with
    ``diagonal=True`` the same with each row's diagonal entry (i, i) first (0 <= i <= j < n)."""
    _check_int("n", n, 0)
    _check_int("i", i, 0)
    _check_int("j", j, 0)
    if diagonal and not i <= j < n:
        raise ValueError(f"(i={i}, j={j}) must satisfy 0 <= i <= j < n={n} (diagonal=True)")
    if not diagonal and not i < j < n:
        raise ValueError(f"(i={i}, j={j}) must satisfy 0 <= i < j < n={n} (diagonal=False)")
    return condensed_row_start(i, n, diagonal) + j - i - (0 if diagonal else 1)


def _budget(free_bytes: int | None, max_device_bytes: int | None) -> int:
    if free_bytes is None and max_device_bytes is None:
        raise ValueError("free_bytes or max_device_bytes is needed (the device's free memory, or a budget)")
    candidates = []
    if free_bytes is not None:
        _check_int("free_bytes", free_bytes, 1)
        candidates.append(free_bytes * 4 // 5)
    if max_device_bytes is not None:
        _check_int("max_device_bytes", max_device_bytes, 1)
        candidates.append(max_device_bytes)
    return min(candidates)


def _check_int(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r} must be an int")
    if value < least:
        raise ValueError(f"{name}={value} must be >= {least}")


def _first_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """The smallest x in [lo, hi] with pred(x), for pred false then true along the range and pred(hi) true."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _last_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """The largest x in [lo, hi] with pred(x), for pred true then false along the range and pred(lo) true."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
