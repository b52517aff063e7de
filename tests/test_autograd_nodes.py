"""The eager C++ autograd nodes (csrc/autograd): a plain eager call that needs a gradient is recorded as one C++ node,
whose gradients must equal those of the registered operator (the Python autograd formula, its reference) for every
semiring, dtype and subset of inputs needing them; whose double backward goes through the operators; which refuses
forward-mode AD and in-place changes of what it saved; and whose long chains free without deep recursion."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import semiring_ops as so
from semiring_ops.build import backends
from semiring_ops.ops import chain_ops, registry
from semiring_ops.semirings import resolve_semiring
from semiring_ops.structures import LinearChainCRF

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def compiled_backend(device):
    """The device's compiled kernels and their nodes (on the CPU, waiting for the autograd modules); skips where only
    the reference is had."""
    be = backends.backend_for(torch.device(device))
    if be.autograd_node("bmm", "bmm_autograd", wait=True) is None:
        pytest.skip(f"no compiled bmm family on {device}: {be.detail}")
    assert be.autograd_node("chain", "crf_log_likelihood_autograd", wait=True) is not None, be.detail
    return be


def _grads(out, inputs, g):
    return torch.autograd.grad(out, [x for x in inputs if x.requires_grad], g)


@pytest.mark.parametrize("semiring", ["log", "max", "min", "std"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@given(
    n=st.integers(0, 40),
    k=st.integers(0, 70),
    m=st.integers(1, 40),
    needs=st.sampled_from([(True, True), (True, False), (False, True)]),
)
def test_node_gradients_equal_the_registered_operators(compiled_backend, device, semiring, dtype, n, k, m, needs):
    S = resolve_semiring(semiring)
    a = torch.randn(3, n, k, device=device).to(dtype).requires_grad_(needs[0])
    b = torch.randn(3, k, m, device=device).to(dtype).requires_grad_(needs[1])
    with_arg = S.selects
    out, _ = registry.bmm_forward_eager(a, b, S.kernel_id, with_arg)
    assert out.grad_fn is not None and out.grad_fn.name() == "SemiringBmmBackward"
    ref, _ = registry.bmm_forward(a, b, S.kernel_id, with_arg)  # the custom op: Python autograd
    torch.testing.assert_close(out, ref, equal_nan=True)
    g = torch.randn_like(out)
    # max / min scatter with atomics on CUDA (and the fused log gradient adds grad_b so): the sums' order may
    # differ between the two runs, so the gradients agree to a few units of the dtype's last place, not bitwise
    tol = 4 * torch.finfo(dtype).eps
    for got, want in zip(_grads(out, (a, b), g), _grads(ref, (a, b), g), strict=True):
        assert got.dtype == want.dtype == dtype
        scale = max(1.0, want.abs().amax().item()) if want.numel() else 1.0
        torch.testing.assert_close(got.double(), want.double(), equal_nan=True, atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("semiring", ["max", "min"])
def test_selection_node_recomputes_a_missing_index(compiled_backend, device, semiring):
    """A forward run without the index (with_arg=False) still routes the gradient to the selected k."""
    S = resolve_semiring(semiring)
    a = torch.randn(2, 5, 6, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 6, 4, device=device, dtype=torch.float64, requires_grad=True)
    out, arg = registry.bmm_forward_eager(a, b, S.kernel_id, False)
    assert arg.numel() == 0
    ref = so.semiring_matmul(a, b, semiring)
    g = torch.randn_like(out)
    for got, want in zip(_grads(out, (a, b), g), _grads(ref, (a, b), g), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("semiring", ["log", "max", "std"])
def test_node_double_backward_through_the_operators(compiled_backend, device, semiring):
    """create_graph=True: the log node calls semiring_ops::log_bmm_backward (differentiable), max / std build their
    gradient from differentiable ATen calls, so second derivatives are right (gradgradcheck in float64)."""
    S = resolve_semiring(semiring)  # (the public std path is torch.bmm: the node is called directly)
    a = torch.randn(2, 4, 5, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 5, 3, device=device, dtype=torch.float64, requires_grad=True)
    product = lambda x, y: registry.bmm_forward_eager(x, y, S.kernel_id, S.selects)[0]  # noqa: E731
    assert product(a, b).grad_fn.name() == "SemiringBmmBackward"
    assert torch.autograd.gradgradcheck(product, (a, b))


def test_node_refuses_forward_mode_ad(compiled_backend, device):
    import torch.autograd.forward_ad as fwAD

    a = torch.randn(1, 3, 3, device=device, requires_grad=True)
    b = torch.randn(1, 3, 3, device=device)
    with fwAD.dual_level():
        dual = fwAD.make_dual(a, torch.ones_like(a))
        with pytest.raises(RuntimeError, match="forward-mode"):
            so.logbmm(dual, b)


def test_node_detects_inputs_changed_in_place(compiled_backend, device):
    a = torch.randn(1, 3, 4, device=device, requires_grad=True)
    b = torch.randn(1, 4, 2, device=device)
    x = a * 1.0  # a non-leaf, so that it may be changed in place
    out = so.logbmm(x, b)
    x.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_node_backward_twice_needs_retain_graph(compiled_backend, device):
    a = torch.randn(1, 3, 4, device=device, requires_grad=True)
    out = so.logbmm(a, torch.randn(1, 4, 2, device=device))
    out.sum().backward(retain_graph=True)
    first = a.grad.clone()
    out.sum().backward()
    torch.testing.assert_close(a.grad, 2 * first)
    out = so.logbmm(a, torch.randn(1, 4, 2, device=device))
    out.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.sum().backward()


def test_a_long_chain_of_nodes_frees_without_deep_recursion(compiled_backend, device):
    """20,000 products in a row: freeing the graph must not recurse once per node (a stack overflow)."""
    x = torch.zeros(1, 1, 2, device=device, requires_grad=True)
    m = torch.zeros(1, 2, 2, device=device)
    y = x
    for _ in range(20_000):
        y = so.logbmm(y, m)
    assert y.grad_fn.name() == "SemiringBmmBackward"
    del y  # frees the chain


# ---------------------------------------------------------------- the CRF's log-likelihood


def _crf_args(device, B, T, C, dtype=torch.float64, needs=(True, True, True, True)):
    g = torch.Generator().manual_seed(B * 100 + T * 10 + C)
    em = torch.randn(B, T, C, generator=g, dtype=dtype).to(device).requires_grad_(needs[0])
    trans = torch.randn(C, C, generator=g, dtype=dtype).to(device).requires_grad_(needs[1])
    start = torch.randn(C, generator=g, dtype=dtype).to(device).requires_grad_(needs[2])
    end = torch.randn(C, generator=g, dtype=dtype).to(device).requires_grad_(needs[3])
    lengths = torch.randint(0, T + 1, (B,), generator=g).to(device)
    tags = torch.randint(0, C, (B, T), generator=g).to(device)
    return em, trans, start, end, lengths, tags


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@given(
    B=st.integers(1, 5),
    T=st.integers(1, 9),
    C=st.integers(1, 7),
    needs=st.sampled_from([(True, True, True, True), (True, False, False, False), (False, True, False, True)]),
)
def test_crf_node_gradients_equal_the_registered_operators(compiled_backend, device, dtype, B, T, C, needs):
    args = _crf_args(device, B, T, C, dtype, needs)
    llh, alpha, log_z = chain_ops.crf_log_likelihood_eager(*args)
    assert llh.grad_fn.name() == "CrfLogLikelihoodBackward"
    assert alpha.grad_fn is None and log_z.grad_fn is None
    ref = chain_ops.crf_log_likelihood(*args)[0]  # the custom op: Python autograd
    torch.testing.assert_close(llh, ref)
    g = torch.randn_like(llh)
    for got, want in zip(_grads(llh, args[:4], g), _grads(ref, args[:4], g), strict=True):
        torch.testing.assert_close(got, want)


def test_crf_train_step_is_one_node_and_passes_gradcheck(compiled_backend, device):
    crf = LinearChainCRF(4, batch_first=True).to(device).double()
    em = torch.randn(3, 5, 4, device=device, dtype=torch.float64, requires_grad=True)
    tags = torch.randint(0, 4, (3, 5), device=device)
    mask = torch.arange(5, device=device) < torch.tensor([5, 3, 1], device=device)[:, None]
    llh = crf(em, tags, mask, reduction="none")
    assert llh.grad_fn.name() == "CrfLogLikelihoodBackward"
    params = (crf.transitions, crf.start_transitions, crf.end_transitions)
    assert torch.autograd.gradcheck(
        lambda e, *_: crf(e, tags, mask, reduction="none"), (em, *params), check_undefined_grad=False
    )
