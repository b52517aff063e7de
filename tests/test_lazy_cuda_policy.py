"""The CUDA policy and launch shape of the lazy kernels (pure functions: no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from semiring_ops.lazy import Vi, Vj
from semiring_ops.lazy.codegen import ROW_REGISTER_BUDGET, CudaConfig, cuda_config, row_registers
from semiring_ops.lazy.cuda_kernels import (
    MIN_BALANCE,
    RANGED_MAX_BLOCKS_PER_SM,
    ranged_split_target,
    ranged_tile,
    rows_per_thread,
    split_count,
)
from semiring_ops.lazy.formula import canonicalize
from semiring_ops.lazy.plan import Plan
from semiring_ops.lazy.reductions import kbest, semiring_reduction


def _plan(formula, reduction, with_arg: bool = False) -> Plan:
    canon, tv = canonicalize(formula.formula)
    return Plan(canon, tuple(v.cat for v in tv), tuple(v.dim for v in tv), reduction, "i", with_arg)


def test_rows_per_thread_follow_the_register_estimate():
    x, y, b = torch.randn(5, 3), torch.randn(6, 3), torch.randn(6, 1)
    d = ((Vi(x) - Vj(y)) ** 2).sum(-1)
    gauss = _plan((-d * 0.5).exp() * Vj(b), semiring_reduction("std"))
    assert cuda_config(gauss, "float32").rows == 8  # 3 outer values + 1 accumulator
    # float64 takes twice the registers per value: fewer rows once the budget is reached
    lse64 = _plan(-d * 10 + Vj(b), semiring_reduction("log"))
    assert cuda_config(lse64, "float64").rows < cuda_config(lse64, "float32").rows
    lse = _plan(-d * 10, semiring_reduction("log"))
    assert cuda_config(lse, "float32").chunk == 4 and cuda_config(gauss, "float32").chunk == 1
    assert cuda_config(_plan(d, kbest(10, False)), "float32").rows == 1  # k-best: 1 row is fastest
    wide = _plan(((Vi(torch.randn(5, 40)) - Vj(torch.randn(6, 40))) ** 2).sum(-1), semiring_reduction("std"))
    cfg = cuda_config(wide, "float32")
    assert cfg.rows * row_registers(wide, "float32", cfg.chunk) <= ROW_REGISTER_BUDGET or cfg.rows == 1


@pytest.mark.parametrize("n", [0, 1, 255, 256, 10_000, 100_000, 1_000_000, 10_000_000])
@pytest.mark.parametrize("sms", [132, 78])
def test_split_count_uses_whole_tiles_and_evens_the_work(n, sms):
    tile = 256
    rows = rows_per_thread(8, n, 1, n, tile, sms, 256)
    blocks = max(1, -(-n // (256 * rows)))
    nsplit, per = split_count(blocks, n, tile, sms)
    assert per % tile == 0 and per >= tile
    assert (nsplit >= 1 and (nsplit - 1) * per < max(n, 1) <= nsplit * per) or n == 0
    tiles = -(-n // tile)
    units = blocks * nsplit
    if tiles >= 64 * 4 and blocks * 64 >= 2 * sms:  # room to split: the GPU is filled and evened out
        assert units >= 2 * sms  # at least two blocks per multiprocessor
        assert units / (sms * -(-units // sms)) >= MIN_BALANCE


def test_rows_per_thread_shrink_only_for_small_problems():
    assert rows_per_thread(8, 1_000_000, 1, 1_000_000, 256, 132, 256) == 8
    assert rows_per_thread(8, 10_000, 1, 10_000, 256, 132, 256) < 8
    assert rows_per_thread(8, 10, 1, 10, 256, 132, 256) == 1


@pytest.mark.parametrize(
    ("rows", "chunks", "block", "rows_per_thread", "mean_terms", "per_sm", "tile"),
    [
        (2000, 64, 256, 1, 667, RANGED_MAX_BLOCKS_PER_SM, 64),  # 31-row segments: 1 live warp of 8, 64-term tiles
        (20000, 64, 256, 2, 6670, 3, 256),  # 312 rows: 5 live warps of 8; many terms, tiles kept
        (200000, 832, 256, 1, 66700, 2, 256),  # 3,125-row segments cut in full blocks: as a dense launch
        (100, 4, 256, 1, 40, RANGED_MAX_BLOCKS_PER_SM, 32),  # too few terms to fill anything: the smallest tile
    ],
)
def test_ranged_launches_split_short_segments_finer(rows, chunks, block, rows_per_thread, mean_terms, per_sm, tile):
    cfg = CudaConfig(block=block, rows=rows_per_thread)
    assert ranged_split_target(cfg, chunks, rows) == per_sm
    tiled = ranged_tile(cfg, chunks, mean_terms, per_sm, 132)
    assert tiled.tile == tile and (tiled.block, tiled.rows) == (block, rows_per_thread)
    nsplit, per = split_count(chunks, mean_terms, tiled.tile, 132, 64, per_sm)
    assert per % tile == 0 and (nsplit - 1) * per < mean_terms <= nsplit * per
    if tile < cfg.tile:  # shrunk: the split reaches the target, or cuts the terms into single tiles
        assert chunks * nsplit >= per_sm * 132 * MIN_BALANCE or per == tile
