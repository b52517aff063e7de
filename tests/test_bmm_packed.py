"""The select kernel of the packed family (csrc/cuda/packed_select_kernels.cu): float32 and packed float16 /
bfloat16 max and min products without an index asked for, on sm_80+, taken by bmm_forward when its tiles fill the
GPU and called directly here (bmm_packed_select) at every size. Its answer must be the float64 answer of the same
inputs rounded once to the input dtype, bit for bit (rounding is monotone, so max_k round(x_k) =
round(max_k x_k)): sizes on both sides of its 128 x 128 output tiles and 8- / 16-deep k-tiles, broadcast (stride 0)
batches and rows, strided, transposed and misaligned views (the vector reads and their scalar fallback), planted
+-inf and NaN."""

from __future__ import annotations

import math

import pytest
import torch
from brute import bmm as brute_bmm
from brute import layout_view
from conftest import HAS_CUDA
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_ops as so
from semiring_ops.build.backends import backend_for
from semiring_ops.semirings import resolve_semiring

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HALF_DTYPES = [torch.float16, torch.bfloat16]
SIZES = st.one_of(st.integers(1, 9), st.sampled_from([7, 8, 9, 15, 16, 17, 127, 128, 129, 130, 255, 257]))
BATCHES = st.sampled_from([((), ()), ((3,), (3,)), ((2,), ()), ((), (2,)), ((2, 1), (1, 3))])
LAYOUTS = st.sampled_from(["contiguous", "transposed", "strided", "offset"])


def _random(shape, dtype, scale=4.0, specials=0.0):
    x = torch.randn(shape, dtype=torch.float64) * scale
    if specials:
        u = torch.rand(shape, dtype=torch.float64)
        x = torch.where(u < specials, -math.inf, x)
        x = torch.where((u >= specials) & (u < 1.5 * specials), math.inf, x)
        x = torch.where((u >= 1.5 * specials) & (u < 1.6 * specials), math.nan, x)
    return x.to(dtype=dtype, device="cuda")


def _assert_bitwise(out: torch.Tensor, ref64: torch.Tensor, dtype: torch.dtype) -> None:
    expect = ref64.to(dtype)
    assert out.dtype == dtype and out.shape == expect.shape
    assert torch.equal(torch.isnan(out), torch.isnan(expect)), "NaN pattern differs"
    same = (out == expect) | torch.isnan(expect)
    assert bool(same.all()), f"{int((~same).sum())} outputs differ from the once-rounded float64 answer"


def _packed(a: torch.Tensor, b: torch.Tensor, semiring: str) -> torch.Tensor:
    """The kernel itself on (B, n, k) x (B, k, m) operands (batch dims expanded, not copied)."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    size = math.prod(batch)
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(size, *a.shape[-2:])
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(size, *b.shape[-2:])
    out = backend_for(a.device).family("packed").bmm_packed_select(a3, b3, semiring == "max")
    assert out.dtype == torch.float32
    return out.reshape(*batch, a.shape[-2], b.shape[-1]).to(a.dtype)


@pytest.mark.parametrize("semiring", ["max", "min"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@settings(max_examples=40)
@given(n=SIZES, k=SIZES, m=SIZES, batch=BATCHES, layout=LAYOUTS, specials=st.sampled_from([0.0, 0.05, 0.3]))
def test_packed_equals_rounded_float64(semiring, dtype, n, k, m, batch, layout, specials):
    a = layout_view(_random(batch[0] + (n, k), dtype, specials=specials), layout)
    b = layout_view(_random(batch[1] + (k, m), dtype, specials=specials), layout)
    _assert_bitwise(_packed(a, b, semiring), brute_bmm(a, b, semiring), dtype)


@pytest.mark.parametrize("semiring", ["max", "min"])
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_bmm_forward_takes_the_packed_path_when_it_fills_the_gpu(semiring, dtype):
    """Without an index, on enough tiles (here 600 blocks), bmm_forward's fp32 output holds 16-bit values (the
    packed path ran); with an index it holds fp32 sums, most of which no 16-bit number equals."""
    a = _random((600, 9, 40), dtype)
    b = _random((600, 40, 11), dtype)
    kid = resolve_semiring(semiring).kernel_id
    backend = backend_for(a.device)
    packed, _ = backend.bmm_forward(a, b, kid, False)
    tracked, arg = backend.bmm_forward(a, b, kid, True)
    assert packed.dtype == torch.float32
    assert torch.equal(packed, packed.to(dtype).float())
    assert not torch.equal(tracked, tracked.to(dtype).float())
    _assert_bitwise(packed.to(dtype), brute_bmm(a, b, semiring), dtype)
    assert arg.shape == tracked.shape
    with torch.no_grad():
        _assert_bitwise(so.semiring_matmul(a, b, semiring), brute_bmm(a, b, semiring), dtype)


def _kernel_names(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("semiring", ["max", "min"])
def test_bmm_forward_takes_the_select_kernel_for_fp32(semiring):
    """float32 without an index: the select kernel on enough tiles (600 blocks), the tile engine with an index or on
    few tiles; the values agree bit for bit (both add in fp32, then select)."""
    a = _random((600, 9, 40), torch.float32, specials=0.05)
    b = _random((600, 40, 11), torch.float32, specials=0.05)
    kid = resolve_semiring(semiring).kernel_id
    backend = backend_for(a.device)
    assert any("select_kernel" in n for n in _kernel_names(lambda: backend.bmm_forward(a, b, kid, False)))
    assert not any("select_kernel" in n for n in _kernel_names(lambda: backend.bmm_forward(a, b, kid, True)))
    assert not any("select_kernel" in n for n in _kernel_names(lambda: backend.bmm_forward(a[:2], b[:2], kid, False)))
    fast, _ = backend.bmm_forward(a, b, kid, False)
    tracked, _ = backend.bmm_forward(a, b, kid, True)
    _assert_bitwise(fast, brute_bmm(a, b, semiring), torch.float32)
    assert torch.equal(fast.isnan(), tracked.isnan()) and bool(((fast == tracked) | fast.isnan()).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("which", ["a rows", "b columns", "a depth", "b depth"])
def test_broadcast_inside_an_operand(dtype, which):
    """A stride-0 row, column or depth dimension (an expanded operand; no vector reads, every element its own):
    n, k, m past one tile each."""
    n, k, m = 131, 37, 133
    a = _random((2, n, k), dtype)
    b = _random((2, k, m), dtype)
    if which == "a rows":
        a = a[:, :1].expand(2, n, k)
    elif which == "b columns":
        b = b[:, :, :1].expand(2, k, m)
    elif which == "a depth":
        a = a[:, :, :1].expand(2, n, k)
    else:
        b = b[:, :1].expand(2, k, m)
    for semiring in ("max", "min"):
        _assert_bitwise(_packed(a, b, semiring), brute_bmm(a, b, semiring), dtype)


def test_packed_entry_refuses_float64():
    a = torch.randn(2, 3, 4, device="cuda", dtype=torch.float64)
    with pytest.raises(RuntimeError, match="float32 / float16 / bfloat16"):
        backend_for(a.device).family("packed").bmm_packed_select(a, a.transpose(1, 2).contiguous(), True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_zero_rows_and_empty_depth(dtype):
    a = _random((3, 130, 17), dtype)
    b = _random((3, 17, 129), dtype)
    a[1, 5] = -math.inf  # a row of the semiring zero: -inf, not NaN
    b[2, :, 7] = -math.inf
    out = _packed(a, b, "max")
    assert bool((out[1, 5] == -math.inf).all()) and bool((out[2, :, 7] == -math.inf).all())
    _assert_bitwise(out, brute_bmm(a, b, "max"), dtype)
    empty = _packed(a[..., :0], b[:, :0], "min")
    assert empty.shape == (3, 130, 129) and bool((empty == math.inf).all())
    assert _packed(a[:, :0], b, "max").shape == (3, 0, 129)


def test_batch_beyond_the_grid_limit():
    """grid.y is capped at 65535 and strides over the batch."""
    a = _random((70_001, 3, 5), torch.float16)
    b = _random((70_001, 5, 2), torch.float16)
    _assert_bitwise(_packed(a, b, "max"), brute_bmm(a, b, "max"), torch.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradient_path_unchanged(dtype):
    """With a gradient asked for, the forward tracks the argmax on the fp32 path and the backward routes it."""
    a = _random((2, 33, 40), dtype).requires_grad_()
    b = _random((2, 40, 31), dtype).requires_grad_()
    out = so.maxbmm(a, b)
    out.float().sum().backward()
    assert a.grad.shape == a.shape and b.grad.shape == b.shape
    # every output routes one unit of gradient to one a entry and one b entry
    assert a.grad.float().sum().item() == pytest.approx(out.numel())
    assert b.grad.float().sum().item() == pytest.approx(out.numel())
