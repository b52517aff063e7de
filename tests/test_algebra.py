"""Algebraic laws of every semiring's matmul: associativity and the identity matrix."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import semiring_ops as so

SEMIRINGS = [so.LogSemiring, so.MaxSemiring, so.MinSemiring, so.StdSemiring]


@pytest.mark.parametrize("S", SEMIRINGS, ids=lambda s: s.name)
@given(n=st.integers(1, 40), k=st.integers(1, 40), p=st.integers(1, 40), m=st.integers(1, 40))
def test_associativity(device, S, n, k, p, m):
    a = torch.randn(2, n, k, dtype=torch.float64, device=device)
    b = torch.randn(2, k, p, dtype=torch.float64, device=device)
    c = torch.randn(2, p, m, dtype=torch.float64, device=device)
    left = S.matmul(S.matmul(a, b), c)
    right = S.matmul(a, S.matmul(b, c))
    torch.testing.assert_close(left, right, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("S", SEMIRINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_identity_matrix(device, S, dtype):
    a = torch.randn(3, 37, 70, dtype=dtype, device=device)
    left = S.identity(37, dtype=dtype, device=device)
    right = S.identity(70, dtype=dtype, device=device)
    torch.testing.assert_close(S.matmul(left, a), a)
    torch.testing.assert_close(S.matmul(a, right), a)


@pytest.mark.parametrize("S", SEMIRINGS, ids=lambda s: s.name)
def test_python_operations_agree_with_matmul(S):
    a = torch.randn(4, 6, dtype=torch.float64)
    b = torch.randn(6, 5, dtype=torch.float64)
    via_ops = S.sum(S.times(a.unsqueeze(-1), b.unsqueeze(-3)), dim=-2)
    torch.testing.assert_close(S.matmul(a, b), via_ops)
    x, y = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    zero = torch.full_like(x, S.zero)
    one = torch.full_like(x, S.one)
    torch.testing.assert_close(S.plus(x, zero), x)
    torch.testing.assert_close(S.times(x, one), x)
    torch.testing.assert_close(S.plus(x, y), S.sum(torch.stack([x, y]), dim=0))
