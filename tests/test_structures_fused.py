"""The fused span kernels (csrc/span_dp.h: Eisner's, CKY's and the semi-Markov inside algorithms and their
adjoints; csrc/chain_dp.h: the linear chain's; csrc/alignment_dp.h: the alignment's, through ops/span_ops.py and
structures/fused.py) against the structures' PyTorch dynamic programs (themselves checked against enumeration in
test_structures_dependency.py / _cky.py / _semimarkov.py / _linear_chain.py / _alignment.py, which run the
kernels too): totals and gradients under log, max
and min, lengths, -inf potentials, strided and 16-bit inputs, gradcheck and gradgradcheck,
torch.library.opcheck, on the CPU and CUDA."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops.build import backends
from semiring_ops.ops import span_ops
from semiring_ops.semirings import LogSemiring, MaxSemiring, MinSemiring
from semiring_ops.structures import Alignment, CKYTree, DependencyTree, LinearChain, SemiMarkov
from semiring_ops.structures.fused import generic_only, span_fast_path

SEMIRINGS = [LogSemiring, MaxSemiring, MinSemiring]
STRUCTURES = {
    "eisner multiroot": (DependencyTree(True), lambda B, N, g: torch.randn(B, N, N, generator=g)),
    "eisner one root": (DependencyTree(False), lambda B, N, g: torch.randn(B, N, N, generator=g)),
    "cky": (CKYTree(), lambda B, N, g: torch.randn(B, N, N, 3, generator=g)),
    "semi-Markov": (SemiMarkov(), lambda B, N, g: torch.randn(B, max(N - 1, 0), 4, 3, 3, generator=g)),
    "linear chain": (LinearChain(), lambda B, N, g: torch.randn(B, max(N - 1, 0), 5, 5, generator=g)),
    # more labels than a 256-thread block has warps: the 1024-thread launch, labels dealt twice over its warps
    "linear chain, 37 labels": (LinearChain(), lambda B, N, g: torch.randn(B, max(N - 1, 0), 37, 37, generator=g)),
    # a second sequence shorter than the first (rows past it and the band's edges inside the grid)
    "alignment": (Alignment(), lambda B, N, g: torch.randn(B, N, N // 2 + 1, 3, generator=g)),
    "alignment, local": (Alignment(local=True), lambda B, N, g: torch.randn(B, N, N // 2 + 1, 3, generator=g)),
    "alignment, banded": (Alignment(max_gap=2), lambda B, N, g: torch.randn(B, N, N, 3, generator=g)),
    "alignment, local banded": (Alignment(True, 1), lambda B, N, g: torch.randn(B, N, N + 2, 3, generator=g)),
}


@pytest.fixture(autouse=True)
def _kernels(device):
    if backends.backend_for(torch.device(device)).kind == "reference":
        pytest.skip("no compiled kernels here")


def _both(structure, pot, lengths, semiring):
    """(fused total, fused grad, generic total, generic grad)."""
    out = []
    for generic in (False, True):
        p = pot.detach().clone().requires_grad_()
        if generic:
            with generic_only():
                total = structure.logpartition(p, lengths, semiring)
        else:
            total = structure.logpartition(p, lengths, semiring)
        weights = torch.arange(1, total.shape[0] + 1, dtype=total.dtype, device=total.device)
        grad = None  # (an item of one position has no parts: nothing depends on them)
        if total.requires_grad:
            (grad,) = torch.autograd.grad((total * weights).sum(), p, allow_unused=True)
        out += [total.detach(), torch.zeros_like(p) if grad is None else grad]
    return out


@pytest.mark.parametrize("name", list(STRUCTURES))
@pytest.mark.parametrize("semiring", SEMIRINGS, ids=lambda s: s.name)
@settings(deadline=None, max_examples=12)
@given(B=st.integers(1, 4), N=st.integers(1, 40), seed=st.integers(0, 10**6), holes=st.booleans())
def test_fused_equals_the_pytorch_program(device, name, semiring, B, N, seed, holes):
    structure, make = STRUCTURES[name]
    g = torch.Generator().manual_seed(seed)
    pot = make(B, N, g).double() * 3
    if semiring is MinSemiring:
        pot = -pot
    if holes:  # forbidden parts: the semiring's zero
        pot = torch.where(torch.rand(pot.shape, generator=g) < 0.3, semiring.zero, pot)
    lengths = torch.randint(1, N + 1, (B,), generator=g)
    lengths[0] = N
    pot, lengths = pot.to(device), lengths.to(device)
    assert span_fast_path(pot, semiring)
    fused, g_fused, generic, g_generic = _both(structure, pot, lengths, semiring)
    torch.testing.assert_close(fused, generic, rtol=1e-10, atol=1e-10)
    assert not g_fused.isnan().any()
    torch.testing.assert_close(g_fused, g_generic, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", list(STRUCTURES))
def test_float32_and_16_bit_inputs(device, name):
    structure, make = STRUCTURES[name]
    g = torch.Generator().manual_seed(3)
    pot = make(3, 33, g).to(device)
    want = structure.partition(pot.double(), None)
    torch.testing.assert_close(structure.partition(pot, None).double(), want, rtol=1e-5, atol=1e-4)
    half = structure.partition(pot.bfloat16(), None)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half.double(), want, rtol=1e-2, atol=0.1)


@pytest.mark.parametrize("name", ["semi-Markov", "linear chain"])  # marginals / argmax without autograd
def test_marginals_and_argmax_of_16_bit_inputs(device, name):
    structure, make = STRUCTURES[name]
    g = torch.Generator().manual_seed(4)
    pot = make(3, 19, g).to(device)
    lengths = torch.tensor([19, 7, 1], device=device)
    half = pot.bfloat16()
    for op, tol in ((structure.marginals, 2e-2), (structure.argmax, 0)):
        got = op(half, lengths)
        assert got.dtype == torch.bfloat16 and got.shape == pot.shape
        torch.testing.assert_close(got.float(), op(half.float(), lengths), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(STRUCTURES))
def test_strided_potentials(device, name):
    structure, make = STRUCTURES[name]
    g = torch.Generator().manual_seed(5)
    pot = make(2, 17, g).double().to(device).transpose(-1, -2).contiguous().transpose(-1, -2)  # swapped strides
    want = structure.partition(pot.contiguous(), None)
    torch.testing.assert_close(structure.partition(pot, None), want)
    torch.testing.assert_close(structure.marginals(pot, None), structure.marginals(pot.contiguous(), None))


def test_no_tree_gives_the_semiring_zero_and_no_nan(device):
    # one root child required, every root arc forbidden: no tree; log Z = -inf, zero gradient
    arc = torch.randn(2, 6, 6, dtype=torch.float64, device=device)
    arc.diagonal(0, 1, 2).fill_(-math.inf)
    p = arc.clone().requires_grad_()
    total = DependencyTree(False).partition(p, None)
    assert torch.isneginf(total).all()
    total.sum().backward()
    assert (p.grad == 0).all()


def test_length_one_items(device):
    arc = torch.randn(3, 5, 5, dtype=torch.float64, device=device)
    lengths = torch.tensor([1, 5, 1], device=device)
    for multiroot in (True, False):
        z = DependencyTree(multiroot).partition(arc, lengths)
        torch.testing.assert_close(z[[0, 2]], arc[[0, 2], 0, 0])  # the root heads the one word
    span = torch.randn(2, 4, 4, 2, dtype=torch.float64, device=device)
    z = CKYTree().partition(span, torch.tensor([1, 1], device=device))
    torch.testing.assert_close(z, torch.logsumexp(span[:, 0, 0], -1))
    edge = torch.randn(2, 3, 3, 4, 4, dtype=torch.float64, device=device)  # one position: any of C labels
    z = SemiMarkov().partition(edge, torch.tensor([1, 4], device=device))
    torch.testing.assert_close(z[0], torch.tensor(math.log(4), dtype=torch.float64, device=device))
    one = torch.randn(2, 0, 4, 4, dtype=torch.float64, device=device)  # N = 1: no edges at all
    want = torch.full((2,), math.log(4), dtype=torch.float64, device=device)
    torch.testing.assert_close(LinearChain().partition(one, None), want)


@pytest.mark.parametrize("name", [name for name in STRUCTURES if "37 labels" not in name])  # (numerical: slow)
def test_gradcheck_and_gradgradcheck(device, name):
    structure, make = STRUCTURES[name]
    g = torch.Generator().manual_seed(11)
    pot = make(2, 6, g).double().to(device).requires_grad_()
    lengths = torch.tensor([6, 4], device=device)

    def total(p):
        return structure.partition(p, lengths)

    torch.autograd.gradcheck(total, (pot,))
    torch.autograd.gradgradcheck(total, (pot,))


@pytest.mark.parametrize(
    "structure_id", [span_ops.EISNER, span_ops.CKY, span_ops.SEMIMARKOV, span_ops.LINEARCHAIN, span_ops.ALIGNMENT]
)
@pytest.mark.parametrize("semiring", SEMIRINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("flag", [False, True])
def test_opcheck(device, structure_id, semiring, flag):
    g = torch.Generator().manual_seed(2)
    shapes = {span_ops.SEMIMARKOV: (3, 6, 3, 2, 2), span_ops.LINEARCHAIN: (3, 6, 4, 4)}
    shapes[span_ops.ALIGNMENT] = (3, 7, 5, 3)
    pot = torch.randn(shapes.get(structure_id, (3, 7, 7)), generator=g, dtype=torch.float64)
    pot = pot.to(device).requires_grad_()
    lengths = torch.tensor([7, 3, 5], device=device)
    args = (pot, lengths, structure_id, semiring.kernel_id, flag)
    torch.library.opcheck(span_ops.span_inside, args)
    _, charts = span_ops.span_inside(*args)
    grad = torch.rand(3, dtype=torch.float64, device=device)
    torch.library.opcheck(span_ops.span_adjoint, (*args, charts, grad), test_utils=("test_schema", "test_faketensor"))


def test_bad_arguments_raise(device):
    pot = torch.randn(2, 4, 4, device=device)
    lengths = torch.tensor([4, 4], device=device)
    with pytest.raises(RuntimeError, match="lengths must be"):
        span_ops.span_inside(pot, lengths.int(), span_ops.EISNER, LogSemiring.kernel_id, True)
    with pytest.raises(RuntimeError, match="potentials must be"):
        span_ops.span_inside(pot[:, :3], lengths, span_ops.CKY, LogSemiring.kernel_id, True)
    with pytest.raises(RuntimeError, match="not log, max or min"):
        span_ops.span_inside(pot, lengths, span_ops.CKY, 3, True)
    edge = torch.randn(2, 3, 1, 2, 2, device=device)
    with pytest.raises(RuntimeError, match=r"semi-Markov edges must be \(B, N - 1, D, C, C\) with D >= 2"):
        span_ops.span_inside(edge, lengths, span_ops.SEMIMARKOV, LogSemiring.kernel_id, False)
    with pytest.raises(RuntimeError, match=r"linear-chain edges must be \(B, N - 1, C, C\) with C >= 1"):
        span_ops.span_inside(edge[:, :, 0, :, :1], lengths, span_ops.LINEARCHAIN, LogSemiring.kernel_id, False)
    with pytest.raises(RuntimeError, match=r"alignment match potentials must be \(B, N, M, 3\) with N, M >= 1"):
        span_ops.span_inside(edge[:, :, :, 0], lengths, span_ops.ALIGNMENT, LogSemiring.kernel_id, False)
    wide = torch.randn(1, 1, 1 << 15, 3, device=device)
    with pytest.raises(RuntimeError, match="M must be below 32768"):
        span_ops.span_inside(wide, lengths[:1].clone().fill_(1), span_ops.ALIGNMENT, LogSemiring.kernel_id, False)
    with pytest.raises(RuntimeError, match="unknown structure id 5"):
        span_ops.span_inside(pot, lengths, 5, LogSemiring.kernel_id, False)


@pytest.mark.parametrize("labels", [1, 100, 150])  # on the GPU: 100 a warp a label, 150 tiles read in place
@pytest.mark.parametrize("semiring", SEMIRINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_linear_chain_label_counts(device, labels, semiring, dtype):
    g = torch.Generator().manual_seed(labels)
    edge = torch.randn(3, 20, labels, labels, generator=g, dtype=torch.float64)
    lengths = torch.tensor([21, 2, 13])
    p = edge.to(device, dtype).requires_grad_()
    total = LinearChain().logpartition(p, lengths.to(device), semiring)
    (grad,) = torch.autograd.grad(total.sum(), p)
    with generic_only():
        q = edge.clone().requires_grad_()
        want = LinearChain().logpartition(q, lengths, semiring)
        (want_grad,) = torch.autograd.grad(want.sum(), q)
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    torch.testing.assert_close(total.cpu().double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(grad.cpu().double(), want_grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("semiring", [MaxSemiring, MinSemiring], ids=lambda s: s.name)
def test_linear_chain_argmax_with_ties_is_one_path(device, semiring):
    """Scores in {0, 1, 2}: many tied best paths; the gradient is exactly one of them (0 / 1 parts, one edge per
    step, consecutive labels agreeing), scoring the total."""
    g = torch.Generator().manual_seed(0)
    edge = torch.randint(0, 3, (4, 15, 6, 6), generator=g).double().to(device).requires_grad_()
    lengths = torch.tensor([16, 1, 9, 2], device=device)
    total = LinearChain().logpartition(edge, lengths, semiring)
    (parts,) = torch.autograd.grad(total.sum(), edge)
    assert set(parts.unique().tolist()) <= {0.0, 1.0}
    for b, L in enumerate(lengths.tolist()):
        steps = parts[b, : L - 1].nonzero().tolist()  # (n, c, c') of each chosen edge, in order of n
        assert [n for n, _, _ in steps] == list(range(L - 1))
        assert all(steps[i][1] == steps[i + 1][2] for i in range(len(steps) - 1))
        assert parts[b, L - 1 :].sum() == 0
        torch.testing.assert_close((parts[b] * edge[b]).sum(), total[b].detach())


def test_linear_chain_without_any_path_gives_zero_gradient(device):
    edge = torch.randn(2, 6, 4, 4, dtype=torch.float64, device=device)
    edge[0, 3] = -math.inf  # item 0: no way through step 3
    p = edge.clone().requires_grad_()
    total = LinearChain().logpartition(p, None, LogSemiring)
    assert torch.isneginf(total[0]) and torch.isfinite(total[1])
    total.sum().backward()
    assert (p.grad[0] == 0).all() and not p.grad.isnan().any()


def test_compile_fullgraph(device):
    torch._dynamo.reset()
    arc = torch.randn(2, 9, 9, dtype=torch.float64, device=device, requires_grad=True)
    tree = DependencyTree()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss(a):
        return tree.partition(a, None).sum()

    value = loss(arc)
    (grad,) = torch.autograd.grad(value, arc)
    torch.testing.assert_close(value, tree.partition(arc, None).sum())
    torch.testing.assert_close(grad, tree.marginals(arc, None))


@pytest.mark.parametrize("name", ["linear chain", "alignment, local", "eisner one root"])
def test_eager_path_equals_the_custom_ops(device, name, monkeypatch):
    """In eager mode the totals call the extension directly (_EagerSpanTotal: no dispatch layers); the values,
    gradients and second derivatives are the custom ops' (which torch.compile and tracing take)."""
    structure, make = STRUCTURES[name]
    pot = make(3, 9, torch.Generator().manual_seed(5)).double().to(device)
    lengths = torch.tensor([9, 4, 1], device=device)
    out = []
    for direct in (True, False):
        if not direct:
            monkeypatch.setattr(span_ops, "direct_call_ok", lambda tensor: False)
        p = pot.clone().requires_grad_()
        total = structure.partition(p, lengths)
        assert (type(total.grad_fn).__name__ == "_EagerSpanTotalBackward") == direct
        (grad,) = torch.autograd.grad(total.sum(), p, create_graph=True)
        (second,) = torch.autograd.grad((grad * torch.cos(pot)).sum(), p)
        out.append((total.detach(), grad.detach(), second, structure.marginals(pot, lengths)))
    for a, b in zip(*out, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
