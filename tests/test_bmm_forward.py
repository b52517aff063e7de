"""Forward values and argmax of the semiring matmul against float64 brute force, on fresh random
inputs: random shapes with sizes on both sides of the tile edges, broadcast batches, non-contiguous
views, every dtype and semiring, compiled kernels and the reference backend."""

from __future__ import annotations

import pytest
import torch
from brute import arg as brute_arg
from brute import bmm as brute_bmm
from brute import layout_view
from hypothesis import given
from hypothesis import strategies as st

import semiring_ops as so

SIZES = st.one_of(st.integers(1, 9), st.sampled_from([15, 16, 17, 31, 33, 63, 64, 65, 66, 127, 129]))
BATCHES = st.sampled_from([((), ()), ((3,), (3,)), ((2,), ()), ((), (2,)), ((2, 1), (1, 3)), ((1,), (4,))])
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
SEMIRINGS = ["log", "max", "min", "std"]

# relative tolerance against the float64 result of the same (rounded) inputs
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _random(shape, dtype, device, scale=3.0):
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype=dtype, device=device)


def _assert_close(out, ref, dtype):
    assert out.dtype == dtype
    assert out.shape == ref.shape
    o, r = out.double().cpu(), ref.cpu()
    finite = torch.isfinite(r)
    assert torch.equal(torch.isfinite(o), finite), "non-finite pattern differs"
    assert torch.equal(o[~finite], r[~finite]), "infinite values differ"
    scale = r[finite].abs().clamp_min(1.0)
    err = ((o[finite] - r[finite]).abs() / scale).max().item() if finite.any() else 0.0
    assert err <= TOL[dtype], f"relative error {err:.3g} > {TOL[dtype]}"


@pytest.mark.parametrize("semiring", SEMIRINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@given(n=SIZES, k=SIZES, m=SIZES, batch=BATCHES, layout=st.sampled_from(["contiguous", "transposed", "strided"]))
def test_forward_matches_brute_force(device, impl, semiring, dtype, n, k, m, batch, layout):
    a = layout_view(_random(batch[0] + (n, k), dtype, device), layout)
    b = layout_view(_random(batch[1] + (k, m), dtype, device), layout)
    out = so.semiring_matmul(a, b, semiring)
    ref = brute_bmm(a, b, semiring)
    if semiring == "std":
        # torch.matmul of 16-bit inputs rounds partial sums; measure against the result's scale
        tol = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
        torch.testing.assert_close(out.double().cpu(), ref.cpu(), rtol=tol, atol=tol * max(1.0, k))
        return
    _assert_close(out, ref, dtype)


@pytest.mark.parametrize("semiring", ["max", "min"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@given(n=SIZES, k=SIZES, m=SIZES, batch=BATCHES)
def test_argmax_agrees_with_torch_max(device, impl, semiring, dtype, n, k, m, batch):
    a = _random(batch[0] + (n, k), dtype, device)
    b = _random(batch[1] + (k, m), dtype, device)
    if k > 2:  # plant exact ties: the lowest k must win
        a[..., 1] = a[..., 0]
        b[..., 1, :] = b[..., 0, :]
    values, index = so.semiring_matmul(a, b, semiring, return_argmax=True)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    ref_values, ref_index = brute_arg(a, b, semiring, acc)
    assert index.dtype == torch.int64
    assert torch.equal(index.cpu(), ref_index.cpu())
    assert torch.equal(values.cpu(), ref_values.to(dtype).cpu())


@pytest.mark.parametrize("semiring", ["log", "max", "min"])
def test_batch_shapes_broadcast_like_matmul(device, semiring):
    a = torch.randn(2, 1, 5, 7, device=device)
    b = torch.randn(3, 7, 4, device=device)
    out = so.semiring_matmul(a, b, semiring)
    assert out.shape == torch.matmul(a, b).shape == (2, 3, 5, 4)
    _assert_close(out, brute_bmm(a, b, semiring), torch.float32)


def test_two_dimensional_inputs(device):
    a = torch.randn(6, 5, device=device)
    b = torch.randn(5, 7, device=device)
    out = so.logbmm(a, b)
    assert out.shape == (6, 7)
    _assert_close(out, brute_bmm(a, b, "log"), torch.float32)


def test_shorthands_and_semiring_classes_agree(device):
    a = torch.randn(3, 8, 9, device=device)
    b = torch.randn(3, 9, 10, device=device)
    assert torch.equal(so.logbmm(a, b), so.semiring_matmul(a, b, so.LogSemiring))
    assert torch.equal(so.maxbmm(a, b), so.MaxSemiring.matmul(a, b))
    assert torch.equal(so.minbmm(a, b), so.semiring_matmul(a, b, "min"))
    assert torch.equal(so.stdbmm(a, b), torch.matmul(a, b))


def test_user_defined_semiring_runs_on_the_generic_path(device):
    class SoftplusMax(so.Semiring):  # max-times over positive reals, no compiled kernel
        name, zero, one = "maxtimes", 0.0, 1.0

        @staticmethod
        def plus(x, y):
            return torch.maximum(x, y)

        @staticmethod
        def times(x, y):
            return x * y

        @staticmethod
        def sum(x, dim=-1):
            return x.amax(dim=dim)

    a = torch.rand(2, 5, 6, device=device, dtype=torch.float64)
    b = torch.rand(2, 6, 3, device=device, dtype=torch.float64)
    out = so.semiring_matmul(a, b, SoftplusMax)
    ref = (a.unsqueeze(-1) * b.unsqueeze(-3)).amax(-2)
    torch.testing.assert_close(out, ref)
