"""Edge cases the issue names: empty dimensions, -inf rows and columns, NaN, +inf, huge batches and
outputs beyond 2**31 elements."""

from __future__ import annotations

import math

import pytest
import torch
from brute import bmm as brute_bmm
from conftest import HAS_CUDA

import semiring_ops as so

ZERO = {"log": -math.inf, "max": -math.inf, "min": math.inf, "std": 0.0}


@pytest.mark.parametrize("semiring", ["log", "max", "min", "std"])
def test_k_zero_gives_the_semiring_zero_and_empty_gradients(device, impl, semiring):
    a = torch.randn(2, 3, 0, device=device, requires_grad=True)
    b = torch.randn(2, 0, 4, device=device, requires_grad=True)
    out = so.semiring_matmul(a, b, semiring)
    assert out.shape == (2, 3, 4)
    assert torch.all(out == ZERO[semiring])
    ga, gb = torch.autograd.grad(out, (a, b), torch.randn_like(out))
    assert ga.shape == (2, 3, 0) and gb.shape == (2, 0, 4)


@pytest.mark.parametrize("semiring", ["log", "max", "min"])
@pytest.mark.parametrize("shape", [((0, 3, 4), (0, 4, 5)), ((2, 0, 4), (2, 4, 5)), ((2, 3, 4), (2, 4, 0))])
def test_empty_batch_rows_or_columns(device, impl, semiring, shape):
    a = torch.randn(shape[0], device=device, requires_grad=True)
    b = torch.randn(shape[1], device=device, requires_grad=True)
    out = so.semiring_matmul(a, b, semiring)
    assert out.shape == torch.matmul(a, b).shape
    ga, gb = torch.autograd.grad(out.sum(), (a, b))
    assert ga.shape == a.shape and gb.shape == b.shape


@pytest.mark.parametrize("semiring", ["log", "max"])
def test_all_neg_inf_row_and_column_give_neg_inf_and_zero_gradient(device, impl, semiring):
    a = torch.randn(2, 5, 70, device=device, dtype=torch.float64)
    b = torch.randn(2, 70, 6, device=device, dtype=torch.float64)
    a[0, 1, :] = -math.inf  # row i=1 of batch 0
    b[1, :, 4] = -math.inf  # column j=4 of batch 1
    a.requires_grad_()
    b.requires_grad_()
    out = so.semiring_matmul(a, b, semiring)
    assert torch.all(out[0, 1, :] == -math.inf)
    assert torch.all(out[1, :, 4] == -math.inf)
    finite = torch.ones_like(out, dtype=torch.bool)
    finite[0, 1, :] = False
    finite[1, :, 4] = False
    assert torch.isfinite(out[finite]).all()
    ga, gb = torch.autograd.grad(out, (a, b), torch.randn_like(out))
    assert not torch.isnan(ga).any() and not torch.isnan(gb).any()
    assert torch.all(ga[0, 1, :] == 0)
    assert torch.all(gb[1, :, 4] == 0)
    ref = brute_bmm(a.detach(), b.detach(), semiring)
    torch.testing.assert_close(out.detach()[finite], ref[finite])


def test_neg_inf_row_second_derivative_is_zero_not_nan(device, impl):
    a = torch.randn(1, 3, 4, dtype=torch.float64, device=device)
    a[0, 0] = -math.inf
    a.requires_grad_()
    b = torch.randn(1, 4, 2, dtype=torch.float64, device=device, requires_grad=True)
    out = so.logbmm(a, b)
    (ga,) = torch.autograd.grad(out, (a,), torch.ones_like(out), create_graph=True)
    gga, ggb = torch.autograd.grad(ga[:, 1:].sum(), (a, b))
    assert not torch.isnan(gga).any() and not torch.isnan(ggb).any()
    assert torch.all(gga[0, 0] == 0)


@pytest.mark.parametrize("semiring", ["log", "max", "min"])
def test_nan_propagates_only_to_the_outputs_it_touches(device, impl, semiring):
    a = torch.randn(2, 4, 67, device=device)
    b = torch.randn(2, 67, 5, device=device)
    a[1, 2, 30] = math.nan
    b[0, 10, 3] = math.nan
    out = so.semiring_matmul(a, b, semiring)
    expected = torch.zeros_like(out, dtype=torch.bool)
    expected[1, 2, :] = True
    expected[0, :, 3] = True
    assert torch.equal(torch.isnan(out), expected)
    torch.testing.assert_close(out[~expected], brute_bmm(a, b, semiring)[~expected].float())


@pytest.mark.parametrize("semiring", ["max", "min"])
def test_argmax_points_at_the_first_nan(device, impl, semiring):
    a = torch.randn(1, 2, 40, device=device)
    b = torch.randn(1, 40, 3, device=device)
    a[0, 0, 17] = math.nan
    a[0, 0, 25] = math.nan
    _, idx = so.semiring_matmul(a, b, semiring, return_argmax=True)
    assert torch.all(idx[0, 0] == 17)


def test_positive_infinity_gives_infinity(device, impl):
    a = torch.randn(1, 3, 9, device=device)
    a[0, 1, 4] = math.inf
    b = torch.randn(1, 9, 2, device=device)
    assert torch.all(so.logbmm(a, b)[0, 1] == math.inf)
    assert torch.all(so.maxbmm(a, b)[0, 1] == math.inf)
    assert torch.isfinite(so.minbmm(a, b)).all()


@pytest.mark.parametrize("semiring", ["log", "max"])
def test_batch_over_65535_entries(device, impl, semiring):
    B = 70_000
    a = torch.randn(B, 3, 5, device=device)
    b = torch.randn(B, 5, 2, device=device)
    out = so.semiring_matmul(a, b, semiring)
    sample = torch.tensor([0, 1, 65_534, 65_535, 65_536, B - 1], device=device)
    torch.testing.assert_close(out[sample], brute_bmm(a[sample], b[sample], semiring).float())


@pytest.mark.slow
@pytest.mark.parametrize("semiring", ["max"])
def test_output_over_two_to_the_31_elements(device, semiring):
    """An output of 2**31 + 2**20 elements: offsets must be 64-bit (values checked past 2**31)."""
    if device == "cuda" and torch.cuda.get_device_properties(0).total_memory < 24 * 2**30:
        pytest.skip("needs 24 GiB of GPU memory")
    n, m = 2**16, 2**15 + 16
    assert n * m > 2**31
    a = torch.randn(1, n, 1, device=device)
    b = torch.randn(1, 1, m, device=device)
    with torch.no_grad():
        out = so.semiring_matmul(a, b, semiring)
    rows = torch.tensor([0, n // 2, n - 1], device=device)
    torch.testing.assert_close(out[0, rows], a[0, rows] + b[0])
    assert out[0, -1, -1].item() == (a[0, -1, 0] + b[0, 0, -1]).item()
    del out
    if HAS_CUDA and device == "cuda":
        torch.cuda.empty_cache()
