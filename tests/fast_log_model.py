"""A NumPy model of csrc/cuda/log_bmm_fast_kernels.cu, run on the CPU by tests/test_bmm_fast.py.

Two parts, each written to mirror the kernel's code line by line (keep them in step with it):

* the index mapping: which thread stages which element into which shared-memory word, which words each lane
  loads into which mma fragment register, which output each accumulator register is, and the tile
  rasterisation; checked against the mma.sync m16n8k8 .tf32 fragment layouts of the PTX ISA and,
  independently, CUTLASS's CuTe layouts for SM80_16x8x8_F32TF32TF32F32_TN;
* the arithmetic: tile maxima (with the bad-row / bad-column NaN marking), exponentials against them,
  TF32 rounding (1 or 3 passes), the running combine and the trust classification, in float32 with the
  kernel's flush-to-zero exp2, producing (out, flags, count) like the C++ entry point.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import torch

# the kernel and its launch header (the block shape the host shares)
KERNEL_SOURCES = [
    Path(__file__).resolve().parent.parent / "csrc" / "cuda" / name
    for name in ("log_bmm_fast_kernels.cu", "fast_log_launch.h")
]

# the kernel's shape constants (test_kernel_constants_match_the_model checks them against the source)
KT, WARPS_M, WARPS_N, WARP_M, WARP_N = 32, 2, 2, 32, 32
MMA_M, MMA_N, MMA_K = 16, 8, 8
TILES_M, TILES_N = WARP_M // MMA_M, WARP_N // MMA_N
BM, BN = WARPS_M * WARP_M, WARPS_N * WARP_N
THREADS = 32 * WARPS_M * WARPS_N
PITCH_A, PITCH_B = KT + 4, BN + 8
QUADS_A, QUADS_B = KT // 4, BN // 4
ROW_STEP_A, ROW_STEP_B = THREADS // QUADS_A, THREADS // QUADS_B
LOADS_A, LOADS_B = BM // ROW_STEP_A, KT // ROW_STEP_B
GROUP_M = 8
TRUST = 2.0**-64
MAX_FINITE = float(np.finfo(np.float32).max)
BAD_MAGNITUDE = 2.0**125
LOG2E = np.float32(math.log2(math.e))
LN2 = np.float32(math.log(2.0))


def kernel_constants() -> dict[str, str]:
    """`constexpr int NAME = VALUE;` / `constexpr int A = x, B = y;` definitions of the kernel source."""
    text = "\n".join(path.read_text() for path in KERNEL_SOURCES)
    found = {}
    for decl in re.findall(r"constexpr int ([^;]+);", text):
        for part in decl.split(","):
            name, _, value = part.partition("=")
            found[name.strip()] = value.strip()
    return found


# ---------------------------------------------------------------- mma.sync m16n8k8 .tf32 fragment layouts


def ptx_a(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of A (16 x 8) held in register a_i of `lane` (PTX ISA, Matrix Fragments for mma.m16n8k8,
    .tf32: row = groupID for a0, a2 and groupID + 8 for a1, a3; col = threadID_in_group for a0, a1 and + 4
    for a2, a3)."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (i & 1), t + 4 * (i >> 1)


def ptx_b(lane: int, i: int) -> tuple[int, int]:
    """(k, n) of B (8 x 8) in register b_i (row = threadID_in_group for b0, + 4 for b1; col = groupID)."""
    g, t = lane >> 2, lane & 3
    return t + 4 * i, g


def ptx_c(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of C / D (16 x 8) in register c_i (row = groupID for c0, c1, + 8 for c2, c3;
    col = threadID_in_group * 2 + (i & 1))."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (i >> 1), 2 * t + (i & 1)


def cute_layout(shape, stride, thread: int, value: int) -> int:
    """A CuTe (Thread, Value) -> index layout ((T0, T1), V...) : ((s0, s1), ...) evaluated: the thread index
    splits over the first mode's shape, the value index over the second's, each coordinate times its stride."""
    (tshape, vshape), (tstride, vstride) = shape, stride
    index = 0
    for coord_src, shp, strd in ((thread, tshape, tstride), (value, vshape, vstride)):
        shp = shp if isinstance(shp, tuple) else (shp,)
        strd = strd if isinstance(strd, tuple) else (strd,)
        for s, d in zip(shp, strd, strict=True):
            index += (coord_src % s) * d
            coord_src //= s
    return index


# CUTLASS include/cute/atom/mma_traits_sm80.hpp, MMA_Traits<SM80_16x8x8_F32TF32TF32F32_TN>; the index is
# column-major over (M, K) = (16, 8) for A, (N, K) = (8, 8) for B, (M, N) = (16, 8) for C (SM80_16x8_Row).
CUTE_A = (((4, 8), (2, 2)), ((16, 1), (8, 64)))
CUTE_B = (((4, 8), 2), ((8, 1), 32))
CUTE_C = (((4, 8), (2, 2)), ((32, 1), (16, 8)))


def cute_a(lane, i):
    idx = cute_layout(*CUTE_A, lane, i)
    return idx % 16, idx // 16


def cute_b(lane, i):
    idx = cute_layout(*CUTE_B, lane, i)
    return idx // 8, idx % 8  # (k, n)


def cute_c(lane, i):
    idx = cute_layout(*CUTE_C, lane, i)
    return idx % 16, idx // 16


def mma_m16n8k8(a_regs: np.ndarray, b_regs: np.ndarray, c_regs: np.ndarray) -> np.ndarray:
    """What the hardware computes from the registers of a warp: a_regs (32, 4), b_regs (32, 2), c_regs
    (32, 4) -> d_regs (32, 4), through the PTX layouts. Each matrix element must come from exactly one
    register."""
    A = np.full((16, 8), np.nan)
    B = np.full((8, 8), np.nan)
    C = np.full((16, 8), np.nan)
    for lane in range(32):
        for i in range(4):
            assert np.isnan(A[ptx_a(lane, i)]), "two registers hold one element of A"
            A[ptx_a(lane, i)] = a_regs[lane, i]
            assert np.isnan(C[ptx_c(lane, i)]), "two registers hold one element of C"
            C[ptx_c(lane, i)] = c_regs[lane, i]
        for i in range(2):
            assert np.isnan(B[ptx_b(lane, i)]), "two registers hold one element of B"
            B[ptx_b(lane, i)] = b_regs[lane, i]
    assert not (np.isnan(A).any() or np.isnan(B).any() or np.isnan(C).any()), "an element held by no register"
    D = A @ B + C
    return np.array([[D[ptx_c(lane, i)] for i in range(4)] for lane in range(32)])


# ---------------------------------------------------------------- the kernel's index mapping


def staging_ids(tid: int) -> dict[str, int]:
    """Kernel::ids(): warp position, lane coordinates and staging coordinates of thread tid."""
    lane, warp = tid & 31, tid >> 5
    return {
        "lane": lane,
        "wm": warp // WARPS_N,
        "wn": warp % WARPS_N,
        "g": lane >> 2,
        "t": lane & 3,
        "aq": tid % QUADS_A,
        "ar": tid // QUADS_A,
        "bq": tid % QUADS_B,
        "br": tid // QUADS_B,
    }


def transform_writes(tid: int):
    """Kernel::transform's hat stores of thread tid: yields ('A', row_local, k_local, word) and
    ('B', k_local, col_local, word) for each element (word: float offset in that operand's hat part)."""
    d = staging_ids(tid)
    for l in range(LOADS_A):
        row_local = d["ar"] + l * ROW_STEP_A
        for e in range(4):
            yield "A", row_local, 4 * d["aq"] + e, row_local * PITCH_A + 4 * d["aq"] + e
    for l in range(LOADS_B):
        krow_local = d["br"] + l * ROW_STEP_B
        for e in range(4):
            yield "B", krow_local, 4 * d["bq"] + e, krow_local * PITCH_B + 4 * d["bq"] + e


def fragment_words(tid: int, mt: int, nt: int, ks: int) -> tuple[list[int], list[int]]:
    """Kernel::products: the hat words lane tid loads into fa[mt][0..3] and fb[nt][0..1] at k-step ks."""
    d = staging_ids(tid)
    src_a = (d["wm"] * WARP_M + mt * MMA_M + d["g"]) * PITCH_A + ks * MMA_K + d["t"]
    src_b = (ks * MMA_K + d["t"]) * PITCH_B + d["wn"] * WARP_N + nt * MMA_N + d["g"]
    return [src_a, src_a + 8 * PITCH_A, src_a + 4, src_a + 8 * PITCH_A + 4], [src_b, src_b + 4 * PITCH_B]


def output_of(tid: int, mt: int, nt: int, c: int) -> tuple[int, int]:
    """Kernel::store: the block-local (row, col) of accumulator register c of mma tile (mt, nt)."""
    d = staging_ids(tid)
    return (
        d["wm"] * WARP_M + mt * MMA_M + d["g"] + 8 * (c >> 1),
        d["wn"] * WARP_N + nt * MMA_N + 2 * d["t"] + (c & 1),
    )


def maxima_of(tid: int, mt: int, nt: int, c: int) -> tuple[int, int]:
    """Kernel::combine: the hat_alpha / hat_beta indices (row, col) it pairs with register c of (mt, nt)."""
    d = staging_ids(tid)
    return (d["wm"] * WARP_M + mt * MMA_M + d["g"] + 8 * (c >> 1), d["wn"] * WARP_N + nt * MMA_N + 2 * d["t"] + (c & 1))


def block_product(a_hat: np.ndarray, b_hat: np.ndarray) -> np.ndarray:
    """One k-tile of one block through the kernel's data path: the transform's stores into the hat buffers,
    each warp's fragment loads and mma's, the store's placement. a_hat (BM, KT), b_hat (KT, BN) -> (BM, BN)."""
    hat_a = np.full(BM * PITCH_A, np.nan)
    hat_b = np.full(KT * PITCH_B, np.nan)
    for tid in range(THREADS):
        for which, r, c, word in transform_writes(tid):
            if which == "A":
                hat_a[word] = a_hat[r, c]
            else:
                hat_b[word] = b_hat[r, c]
    out = np.full((BM, BN), np.nan)
    for warp in range(THREADS // 32):
        tids = [32 * warp + lane for lane in range(32)]
        for mt in range(TILES_M):
            for nt in range(TILES_N):
                acc = np.zeros((32, 4))
                for ks in range(KT // MMA_K):
                    words = [fragment_words(tid, mt, nt, ks) for tid in tids]
                    a_regs = np.array([[hat_a[w] for w in wa] for wa, _ in words])
                    b_regs = np.array([[hat_b[w] for w in wb] for _, wb in words])
                    acc = mma_m16n8k8(a_regs, b_regs, acc)
                for lane, tid in enumerate(tids):
                    for c in range(4):
                        r, col = output_of(tid, mt, nt, c)
                        assert np.isnan(out[r, col]), "two registers store one output"
                        out[r, col] = acc[lane, c]
    return out


def tile_of_block(pid: int, tiles_m: int, tiles_n: int) -> tuple[int, int]:
    """The kernel's grouped rasterisation: blockIdx.x -> (tile row, tile column)."""
    group = GROUP_M * tiles_n
    first_m = (pid // group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    return first_m + (pid % group) % group_rows, (pid % group) // group_rows


# ---------------------------------------------------------------- the arithmetic


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def ex2_ftz(x: np.ndarray) -> np.ndarray:
    """ex2.approx.ftz.f32, up to its ~2^-22 relative error: 2^x with results below 2^-126 flushed to 0."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = np.exp2(_f32(x))
    return np.where(y < np.float32(2.0**-126), np.float32(0), y).astype(np.float32)


def round_tf32(x: np.ndarray) -> np.ndarray:
    """The kernel's round_tf32: (bits + 0x1000) & 0xffffe000 (cvt.rna.tf32.f32 for finite x)."""
    u = _f32(x).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def tile_maxima(x: np.ndarray, axis: int, k: int, num_kt: int) -> np.ndarray:
    """tile_row_maxima / tile_col_maxima: per k-tile maxima (natural units, float32), -inf past k, NaN in
    every tile of a row / column holding NaN, +inf or |x| > 2^125. x: (B, n, k) with axis=2 or (B, k, m) with
    axis=1 -> (B, num_kt, n or m)."""
    pad = [(0, 0)] * 3
    pad[axis] = (0, num_kt * KT - k)
    xp = np.pad(x.astype(np.float32), pad, constant_values=-np.inf)
    if axis == 2:  # (B, n, T, KT) -> (B, T, n)
        tm = xp.reshape(xp.shape[0], xp.shape[1], num_kt, KT).max(axis=3).transpose(0, 2, 1)
    else:  # (B, T, KT, m) -> (B, T, m)
        tm = xp.reshape(xp.shape[0], num_kt, KT, xp.shape[2]).max(axis=2)
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(tm) <= BAD_MAGNITUDE) & (tm != -np.inf)
    return np.where(bad.any(axis=1, keepdims=True), np.float32(np.nan), tm).astype(np.float32)


def model_log_bmm_fast(a: torch.Tensor, b: torch.Tensor, passes: int):
    """What semiring_ops::log_bmm_fast's C++ entry returns for a (B, n, k), b (B, k, m): (out, flags, count)
    as CPU torch tensors, computed the kernel's way (float32; the tensor core's fp32 sums modelled by a
    float64 product rounded to float32, each FFMA by a float64 multiply-add rounded once)."""
    A = a.detach().float().cpu().numpy()  # 16-bit -> float32 is exact, as at staging
    Bm = b.detach().float().cpu().numpy()
    nb, n, k = A.shape
    m = Bm.shape[2]
    out = np.full((nb, n, m), -np.inf, dtype=np.float32)
    flags = np.zeros((nb, n, m), dtype=np.uint8)
    if k == 0 or out.size == 0:
        return torch.from_numpy(out), torch.from_numpy(flags), torch.zeros(1, dtype=torch.int64)
    num_kt = -(-k // KT)
    rmax = tile_maxima(A, 2, k, num_kt)  # (B, T, n)
    cmax = tile_maxima(Bm, 1, k, num_kt)  # (B, T, m)
    mx = np.full((nb, n, m), -MAX_FINITE, dtype=np.float32)
    acc = np.zeros((nb, n, m), dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for t in range(num_kt):
            lo_k, hi_k = t * KT, min(k, (t + 1) * KT)
            alpha = rmax[:, t, :] * LOG2E  # float32 products: __fmul_rn
            beta = cmax[:, t, :] * LOG2E
            xa = A[:, :, lo_k:hi_k] * LOG2E - alpha[:, :, None]
            xb = Bm[:, lo_k:hi_k, :] * LOG2E - beta[:, None, :]
            ok_a = np.abs(alpha)[:, :, None] <= MAX_FINITE
            ok_b = np.abs(beta)[:, None, :] <= MAX_FINITE
            ah = ex2_ftz(np.where(ok_a, xa, -np.inf))
            bh = ex2_ftz(np.where(ok_b, xb, -np.inf))
            a_hi, b_hi = round_tf32(ah), round_tf32(bh)
            P = a_hi.astype(np.float64) @ b_hi.astype(np.float64)
            if passes == 3:
                a_lo, b_lo = round_tf32(ah - a_hi), round_tf32(bh - b_hi)
                P += a_lo.astype(np.float64) @ b_hi.astype(np.float64) + a_hi.astype(np.float64) @ b_lo.astype(
                    np.float64
                )
            P = P.astype(np.float32)
            s = alpha[:, :, None] + beta[:, None, :]
            dlt = s - mx
            up = dlt > 0
            e = ex2_ftz(-np.abs(dlt)).astype(np.float64)
            raised = (acc.astype(np.float64) * e + P).astype(np.float32)
            kept = (P.astype(np.float64) * e + acc).astype(np.float32)
            acc = np.where(up, raised, kept)
            mx = np.fmax(mx, s)
        trusted = acc >= TRUST
        empty = (acc == 0) & (mx == np.float32(-MAX_FINITE))
        value = (mx + np.log2(np.where(trusted, acc, 1)).astype(np.float32)) * LN2
    out = np.where(trusted, value, np.where(empty, -np.inf, np.nan)).astype(np.float32)
    flags = (~trusted & ~empty).astype(np.uint8)
    count = torch.tensor([int(flags.sum())], dtype=torch.int64)
    return torch.from_numpy(out), torch.from_numpy(flags), count
