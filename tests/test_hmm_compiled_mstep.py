"""The hmm family's per-iteration kernels besides the E-step: the Gaussian log-density (csrc/cpu/hmm_emissions_cpu.cpp)
against a float64 brute force and the torch forms it replaces in every covariance type (and the variational Gaussian's
sub-normalised density), and the Dirichlet M-step (csrc/cpu/hmm_mstep_cpu.cpp) against its torch form: random
sizes, poisoned outputs, NaN, -inf and empty rows; and both ops' argument checks."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.build.backends import set_poison_outputs
from semiring_ops.hmm.emissions import base as emission_base
from semiring_ops.hmm.emissions import gaussian as gaussian_module
from semiring_ops.hmm.emissions.base import dirichlet_map
from semiring_ops.hmm.emissions.gaussian import compiled_gaussian_log_prob, gaussian_emission

pytestmark = pytest.mark.filterwarnings("ignore")


def _built(fn):
    """The compiled op, or a skip where the hmm kernel family is not built."""
    if fn is None:
        pytest.skip("the hmm kernel family is not built here")
    return fn


def _log_prob_op():
    return _built(compiled_gaussian_log_prob(torch.zeros(1, 2, dtype=torch.float64)))


@settings(max_examples=40, deadline=None)
@given(
    N=st.integers(0, 40),
    C=st.integers(1, 5),
    D=st.sampled_from([1, 2, 3, 4, 7, 32]),
    dense=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 2**31 - 1),
)
def test_gaussian_log_prob_matches_float64_brute_force(N, C, D, dense, dtype, seed):
    op = _log_prob_op()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64) * 3
    means = torch.randn(C, D, generator=gen, dtype=torch.float64)
    factors = torch.randn(C, D, D, generator=gen, dtype=torch.float64) if dense else torch.rand(C, D, generator=gen)
    offsets = torch.randn(C, generator=gen, dtype=torch.float64)
    set_poison_outputs(True)
    try:
        got = op(x.to(dtype), means.to(dtype), factors.to(dtype), offsets.to(dtype))
    finally:
        set_poison_outputs(False)
    want = torch.empty(N, C, dtype=torch.float64)
    for n in range(N):
        for c in range(C):
            d = x[n] - means[c]
            z = factors[c] @ d if dense else factors[c].double() * d
            want[n, c] = offsets[c] - 0.5 * float(z @ z)
    assert got.shape == (N, C) and got.dtype == dtype
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * scale)


def test_gaussian_log_prob_propagates_nan_and_takes_strided_inputs():
    op = _log_prob_op()
    x = torch.randn(6, 3, dtype=torch.float64).T.contiguous().T  # a transposed (non-contiguous) view
    x[2, 1] = torch.nan
    means, factors, offsets = torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64), None
    offsets = torch.zeros(2, dtype=torch.float64)
    got = op(x, means, factors, offsets)
    assert torch.isnan(got[2]).all() and torch.isfinite(got[[0, 1, 3, 4, 5]]).all()
    torch.testing.assert_close(got[0], -0.5 * x[0].square().sum().expand(2))


def test_gaussian_log_prob_bad_arguments_name_themselves():
    op = _log_prob_op()
    x, m, f, o = torch.zeros(4, 2, dtype=torch.float64), torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3)
    m, f, o = m.double(), f.double(), o.double()
    with pytest.raises(RuntimeError, match=r"factors must be \(C, D\)"):
        op(x, m, f[:2], o)
    with pytest.raises(RuntimeError, match=r"offsets must be \(C,\)"):
        op(x, m, f, o[:1])
    with pytest.raises(RuntimeError, match=r"x must be \(N, D\) and means \(C, D\)"):
        op(x[:, :1], m, f, o)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        op(x.half(), m.half(), f.half(), o.half())
    with pytest.raises(RuntimeError, match="must share x's dtype"):
        op(x, m.float(), f, o)
    with pytest.raises(RuntimeError, match="at most 32 features"):
        op(torch.zeros(1, 33, dtype=torch.float64), torch.zeros(1, 33).double(), torch.ones(1, 33).double(), o[:1])


@pytest.mark.parametrize("covariance_type", ["spherical", "diag", "full", "tied"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_emission_log_prob_compiled_equals_torch(covariance_type, dtype, monkeypatch):
    """GaussianEmission.log_prob without a gradient (the compiled pass) equals the torch form it had, which still
    serves when a gradient is wanted; batch dimensions keep their shape."""
    _log_prob_op()
    torch.manual_seed(0)
    C, D = 3, 4
    emission = gaussian_emission(covariance_type, C, D).to(dtype)
    x = torch.randn(2, 7, D, dtype=torch.float64).to(dtype) * 2
    emission.init_from_data(x.reshape(-1, D), torch.Generator().manual_seed(0))
    with torch.no_grad():
        emission.means.add_(torch.randn(C, D, dtype=dtype))
        compiled = emission.log_prob(x)
        monkeypatch.setattr(gaussian_module, "compiled_gaussian_log_prob", lambda *a: None)
        reference = emission.log_prob(x)
    with_grad = emission.log_prob(x)  # a gradient wanted: torch's form, differentiable
    assert with_grad.requires_grad
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert compiled.shape == (2, 7, C)
    torch.testing.assert_close(compiled, reference, rtol=tol, atol=tol)
    torch.testing.assert_close(with_grad.detach(), reference, rtol=tol, atol=tol)


@pytest.mark.parametrize("covariance_type", ["spherical", "diag", "full", "tied"])
def test_variational_gaussian_density_compiled_equals_torch(covariance_type, monkeypatch):
    _log_prob_op()
    from semiring_ops import vhmm
    from semiring_ops.hmm.variational import gaussian as vgaussian

    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 3)) + np.repeat(np.eye(3) * 4, 20, axis=0)
    model = vhmm.VariationalGaussianHMM(3, covariance_type=covariance_type, n_iter=2, random_state=0).fit(X)
    compiled = model._subnorm_log_emissions(X)
    monkeypatch.setattr(vgaussian, "compiled_gaussian_log_prob", lambda *a: None)
    torch.testing.assert_close(compiled, model._subnorm_log_emissions(X), rtol=1e-12, atol=1e-12)


def _dirichlet_op():
    zeros = torch.zeros(2, dtype=torch.float64)
    return _built(emission_base._compiled_dirichlet_map(zeros, zeros))


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 6),
    K=st.integers(1, 7),
    keep_zeros=st.booleans(),
    prior=st.sampled_from([1.0, 0.5, 2.0, "array"]),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 2**31 - 1),
)
def test_dirichlet_map_compiled_equals_torch(rows, K, keep_zeros, prior, dtype, seed):
    """Counts with zeros and whole empty rows, previous with -inf (forbidden transitions), priors below 1 that
    clamp counts to 0, a NaN row: the compiled M-step gives the torch form's numbers, every entry written."""
    _dirichlet_op()
    rng = np.random.default_rng(seed)
    counts = torch.from_numpy(rng.exponential(size=(rows, K)) * (rng.random((rows, K)) < 0.7)).to(dtype)
    counts[0] = 0.0  # a row with nothing: keeps previous (unless a prior > 1 gives it mass)
    previous = torch.log_softmax(torch.from_numpy(rng.normal(size=(rows, K))), -1).to(dtype)
    previous[rng.random((rows, K)) < 0.2] = -math.inf
    if rows > 2:
        counts[2, 0] = math.nan
    concentration = rng.uniform(0.3, 3.0, size=(rows, K)) if prior == "array" else prior
    set_poison_outputs(True)
    try:
        got = dirichlet_map(counts, concentration, previous, "prior", keep_zeros)
    finally:
        set_poison_outputs(False)
    with mock.patch.object(emission_base, "_compiled_dirichlet_map", lambda *a: None):
        want = dirichlet_map(counts, concentration, previous, "prior", keep_zeros)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


def test_dirichlet_map_bad_arguments_name_themselves():
    op = _dirichlet_op()
    a = torch.zeros(3, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="must have one shape"):
        op(a, a[:2], a, True)
    with pytest.raises(RuntimeError, match="float32 or float64"):
        op(a.half(), a.half(), a.half(), True)
    with pytest.raises(RuntimeError, match="share counts' dtype"):
        op(a, a.float(), a, False)


def test_a_gradient_keeps_the_torch_forms():
    """With a gradient wanted, neither compiled op is taken (they have no backward): the results differentiate."""
    counts = torch.rand(3, 3, dtype=torch.float64, requires_grad=True)
    out = dirichlet_map(counts, 1.0, torch.zeros(3, 3, dtype=torch.float64), "prior", False)
    out.sum().backward()
    assert counts.grad is not None
