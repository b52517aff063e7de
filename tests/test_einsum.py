"""semiring_ops.einsum against a float64 brute force over every label at once, on random equations (hypothesis:
1-4 operands, repeated labels, size-1 broadcasting, '...', empty sums), under every semiring; gradcheck and
gradgradcheck for log and std; the winning indices of max / min; the planner's orders; bad input."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import semiring_ops as so
from semiring_ops.einsum import einsum, execute
from semiring_ops.einsum.equation import bind, parse
from semiring_ops.einsum.plan import OPTIMAL_LIMIT, plan_contractions, plan_cut

SEMIRINGS = ["log", "max", "min", "std"]
REDUCE = {
    "log": lambda t, dims: torch.logsumexp(t, dims) if dims else t,
    "max": lambda t, dims: t.amax(dims) if dims else t,
    "min": lambda t, dims: t.amin(dims) if dims else t,
    "std": lambda t, dims: t.sum(dims) if dims else t,
}
ZERO = {"log": -math.inf, "max": -math.inf, "min": math.inf, "std": 0.0}


def brute(equation: str, operands, semiring: str) -> torch.Tensor:
    """Every term of the einsum over all labels at once (float64), reduced with the semiring's plus."""
    bound = bind(parse(equation), [tuple(t.shape) for t in operands])
    labels = [*bound.output, *bound.summed]
    sizes = [bound.sizes[lab] for lab in labels]
    grids = torch.meshgrid(*[torch.arange(s) for s in sizes], indexing="ij") if labels else []
    total = None
    for t, term in zip(operands, bound.inputs, strict=True):
        index = tuple(grids[labels.index(lab)] if t.shape[d] != 1 else 0 for d, lab in enumerate(term))
        value = t.double().cpu()[index] if term else t.double().cpu().expand(sizes)
        value = value.expand(sizes) if sizes else value
        if total is None:
            total = value
        elif semiring == "std":
            total = total * value
        else:
            total = total + value
    summed = tuple(range(len(bound.output), len(labels)))
    if any(sizes[d] == 0 for d in summed):
        return torch.full([bound.sizes[lab] for lab in bound.output], ZERO[semiring], dtype=torch.float64)
    return REDUCE[semiring](total, summed)


@st.composite
def equations(draw):
    """(equation, operand shapes): 1-4 operands over labels a-e, repeated labels, size-1 and empty dims, '...'."""
    n = draw(st.integers(1, 4))
    alphabet = "abcde"
    size = {
        lab: draw(st.sampled_from([0, 1, 2, 3, 4] if draw(st.integers(0, 9)) == 0 else [1, 2, 3, 4]))
        for lab in alphabet
    }
    use_ellipsis = draw(st.booleans()) and n <= 3
    ell_sizes = [draw(st.integers(1, 3)) for _ in range(2)]
    terms, shapes = [], []
    for _ in range(n):
        term = draw(st.lists(st.sampled_from(alphabet), min_size=0, max_size=3))
        shape = [size[lab] if draw(st.integers(0, 4)) else 1 for lab in term]  # some dims broadcast (size 1)
        for lab in set(term):  # a repeated label: one size within the operand
            first = shape[term.index(lab)]
            shape = [first if t == lab else s for t, s in zip(term, shape, strict=True)]
        if use_ellipsis:
            rank = draw(st.integers(0, 2))
            ell = [ell_sizes[2 - rank + i] if draw(st.integers(0, 3)) else 1 for i in range(rank)]
            terms.append("..." + "".join(term))
            shapes.append(tuple(ell + shape))
        else:
            terms.append("".join(term))
            shapes.append(tuple(shape))
    used = sorted({lab for t in terms for lab in t if lab.isalpha()})
    if draw(st.booleans()):
        out = "".join(draw(st.permutations(used))[: draw(st.integers(0, len(used)))])
        if use_ellipsis and draw(st.booleans()):
            out = "..." + out
        return ",".join(terms) + "->" + out, shapes
    return ",".join(terms), shapes


def _operands(shapes, device, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype).to(device) for s in shapes]


@pytest.mark.parametrize("semiring", SEMIRINGS)
@settings(max_examples=60)
@given(case=equations(), seed=st.integers(0, 2**31 - 1))
def test_random_equations_match_the_brute_force(device, semiring, case, seed):
    equation, shapes = case
    operands = _operands(shapes, device, seed=seed)
    got = einsum(equation, *operands, semiring=semiring)
    want = brute(equation, operands, semiring)
    assert got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, rtol=1e-9, atol=1e-9, equal_nan=True)


@pytest.mark.parametrize("semiring", ["max", "min"])
@settings(max_examples=40)
@given(case=equations(), seed=st.integers(0, 2**31 - 1))
def test_the_winning_indices_give_the_result(device, semiring, case, seed):
    """return_argmax: (*out_shape, summed labels in first-appearance order); the term at those indices is the result."""
    equation, shapes = case
    operands = _operands(shapes, device, seed=seed)
    value, arg = einsum(equation, *operands, semiring=semiring, return_argmax=True)
    bound = bind(parse(equation), shapes)
    assert arg.shape == (*value.shape, len(bound.summed)) and arg.dtype == torch.int64
    if value.numel() == 0 or any(bound.sizes[lab] == 0 for lab in bound.summed):
        return
    out_sizes = [torch.arange(bound.sizes[lab]) for lab in bound.output]
    out_grid = torch.meshgrid(*out_sizes, indexing="ij") if out_sizes else []
    where = {lab: out_grid[i] for i, lab in enumerate(bound.output)}
    where |= {lab: arg[..., i].cpu() for i, lab in enumerate(bound.summed)}
    term = 0.0
    for t, labels in zip(operands, bound.inputs, strict=True):
        index = tuple(where[lab] if t.shape[d] != 1 else 0 for d, lab in enumerate(labels))
        term = term + (t.double().cpu()[index] if labels else t.double().cpu())
    torch.testing.assert_close(torch.as_tensor(term).expand(value.shape), value.cpu(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("semiring", ["log", "std"])
@pytest.mark.parametrize(
    "equation,shapes",
    [
        ("bik,bkj->bij", [(2, 3, 4), (2, 4, 5)]),
        ("ai,ij,jk->ak", [(3, 4), (4, 2), (2, 5)]),
        ("ii,i->i", [(3, 3), (3,)]),
        ("...ij,...jk->...ik", [(2, 1, 3, 2), (4, 2, 3)]),
        ("abc,b->a", [(3, 2, 2), (2,)]),
        ("ij,ij->", [(2, 3), (1, 3)]),
        ("ab,bc,cd,da->", [(2, 3), (3, 2), (2, 3), (3, 2)]),
    ],
)
def test_gradcheck_and_gradgradcheck(device, semiring, equation, shapes):
    operands = [t.requires_grad_() for t in _operands(shapes, device, seed=7)]
    if semiring == "std":
        operands = [t.detach().abs().add(0.5).requires_grad_() for t in operands]

    def fn(*xs):
        return einsum(equation, *xs, semiring=semiring)

    assert torch.autograd.gradcheck(fn, operands)
    assert torch.autograd.gradgradcheck(fn, operands)


@pytest.mark.parametrize("semiring", ["max", "min"])
def test_max_min_gradient_goes_to_the_winning_terms_first_of_ties(device, semiring):
    x = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], device=device, requires_grad=True)
    y = torch.zeros(3, 2, device=device, requires_grad=True)
    pick = max if semiring == "max" else min
    out, arg = einsum("ij,jk->ik", x, y, semiring=semiring, return_argmax=True)
    out.sum().backward()
    for i, row in enumerate(x.detach().cpu().tolist()):
        best = row.index(pick(row))  # the first of tied extrema
        assert arg[i, :, 0].tolist() == [best, best]
        expect = [2.0 if j == best else 0.0 for j in range(3)]
        assert x.grad[i].tolist() == expect


def test_empty_sums_give_the_zero_with_zero_gradients(device):
    for semiring in SEMIRINGS:
        a = torch.randn(3, 0, device=device, dtype=torch.float64, requires_grad=True)
        b = torch.randn(0, 2, device=device, dtype=torch.float64, requires_grad=True)
        out = einsum("ik,kj->ij", a, b, semiring=semiring)
        assert torch.equal(out, torch.full((3, 2), ZERO[semiring], dtype=torch.float64, device=device))
        out.sum().backward()
        assert a.grad.shape == a.shape and b.grad.shape == b.shape


def test_planner_finds_the_cheap_order():
    """A chain of matrices A (2 x 1000), B (1000 x 2), C (2 x 1000): (AB) C, not A (BC)."""
    sizes = {"a": 2, "b": 1000, "c": 2, "d": 1000}
    plan = plan_contractions([("a", "b"), ("b", "c"), ("c", "d")], ("a", "d"), sizes)
    assert plan.steps[0] == (0, 1)
    assert plan.cells == 2 * 1000 * 2 + 2 * 2 * 1000


def test_planner_optimal_and_greedy_agree_on_a_chain():
    """Past OPTIMAL_LIMIT operands the greedy order; on a chain of equal matrices both are left to right."""
    n = OPTIMAL_LIMIT + 2
    labels = "abcdefghijklm"
    inputs = [(labels[i], labels[i + 1]) for i in range(n)]
    sizes = dict.fromkeys(labels, 3)
    plan = plan_contractions(inputs, (labels[0], labels[n]), sizes)
    assert len(plan.steps) == n - 1 and plan.cells == (n - 1) * 27


def test_memory_budget_steers_the_order(device):
    """'bc,ad,aec,eb->': the fewest cells (1402) pass through a 200-element intermediate; under a budget of 199 the
    planner takes an order of 2052 cells whose intermediates hold at most 50, and the result is the same."""
    inputs = [("b", "c"), ("a", "d"), ("a", "e", "c"), ("e", "b")]
    sizes = {"a": 2, "b": 5, "c": 5, "d": 5, "e": 40}
    free = plan_contractions(inputs, (), sizes)
    tight = plan_contractions(inputs, (), sizes, budget_elements=199)
    assert (free.cells, free.peak) == (1402, 200)
    assert (tight.cells, tight.peak) == (2052, 50)
    shapes = [tuple(sizes[lab] for lab in term) for term in inputs]
    operands = _operands(shapes, device)
    want = brute("bc,ad,aec,eb->", operands, "log")
    for memory in (None, 199 * 8):
        torch.testing.assert_close(einsum("bc,ad,aec,eb->", *operands, memory=memory).cpu(), want)


@pytest.fixture
def intermediates(monkeypatch):
    """The number of elements of every pairwise intermediate einsum makes (each step's result but the last's,
    which is the output or a chunk of it)."""
    seen: list[int] = []
    contract_pair, steps = execute._contract_pair, execute._steps

    def recorded_steps(*args, **kwargs):
        made: list[int] = []

        def recorded_pair(*a, **k):
            result = contract_pair(*a, **k)
            made.append(result.value.numel())
            return result

        monkeypatch.setattr(execute, "_contract_pair", recorded_pair)
        try:
            return steps(*args, **kwargs)
        finally:
            monkeypatch.setattr(execute, "_contract_pair", contract_pair)
            seen.extend(made[:-1])

    monkeypatch.setattr(execute, "_steps", recorded_steps)
    return seen


@pytest.mark.parametrize("semiring", SEMIRINGS)
@settings(max_examples=25, deadline=None)
@given(case=equations(), seed=st.integers(0, 2**31 - 1), budget=st.integers(1, 24))
def test_a_memory_budget_no_order_fits_cuts_the_contraction_into_chunks(
    device, semiring, case, seed, budget, intermediates
):
    """memory= below every order's largest intermediate: the contraction runs in chunks along an output or a
    summed label (plan_cut), every intermediate within the budget, the result and the winners unchanged."""
    intermediates.clear()
    equation, shapes = case
    operands = _operands(shapes, device, seed=seed)
    got = einsum(equation, *operands, semiring=semiring, memory=budget * 8)
    assert all(n <= budget for n in intermediates), (intermediates, budget)
    torch.testing.assert_close(got.cpu(), brute(equation, operands, semiring), rtol=1e-9, atol=1e-9, equal_nan=True)
    if semiring in ("max", "min"):
        value, arg = einsum(equation, *operands, semiring=semiring, return_argmax=True, memory=budget * 8)
        whole = einsum(equation, *operands, semiring=semiring, return_argmax=True)
        torch.testing.assert_close(value, whole[0], equal_nan=True)  # the same terms, added in another order
        assert torch.equal(arg, whole[1])


def test_chunks_along_a_summed_label_keep_their_gradients(device, intermediates):
    """'ij,jk,kl->' under a 2-element budget: every intermediate (i, k) or (j, l) has 16; the contraction is cut
    along summed labels, the chunks' results added in the semiring; gradcheck and gradgradcheck through it."""
    x, y, z = (t.requires_grad_() for t in _operands([(4, 4), (4, 4), (4, 4)], device))
    cut = plan_cut([("i", "j"), ("j", "k"), ("k", "l")], (), dict.fromkeys("ijkl", 4), 2)
    assert cut is not None and cut[0] in "ijkl"
    for semiring in ("log", "std"):
        fn = lambda *t, s=semiring: einsum("ij,jk,kl->", *t, semiring=s, memory=16)  # noqa: E731
        torch.autograd.gradcheck(fn, (x, y, z))
        torch.autograd.gradgradcheck(fn, (x, y, z))
    assert intermediates and max(intermediates) <= 2
    for semiring in ("max", "min"):  # the gradient reaches the winning term, found through the chunks
        value, arg = einsum("ij,jk,kl->", x, y, z, semiring=semiring, return_argmax=True, memory=16)
        (gx, gy, gz) = torch.autograd.grad(value, (x, y, z))
        i, j, k, l = arg.tolist()
        for g, (r, c) in ((gx, (i, j)), (gy, (j, k)), (gz, (k, l))):
            want = torch.zeros_like(g)
            want[r, c] = 1
            assert torch.equal(g, want)


def test_matches_semiring_matmul_and_torch(device):
    a, b = torch.randn(4, 5, 6, device=device), torch.randn(4, 6, 7, device=device)
    for semiring in SEMIRINGS:
        torch.testing.assert_close(einsum("bik,bkj->bij", a, b, semiring=semiring), so.semiring_matmul(a, b, semiring))
    torch.testing.assert_close(einsum("bik,bkj->bij", a, b, semiring="std"), torch.einsum("bik,bkj->bij", a, b))


def test_16_bit_operands_accumulate_in_float32(device):
    """As semiring_matmul: float32 accumulation in each step, the result in the operands' dtype; under autocast
    the log steps run in float32."""
    a, b, c = torch.randn(3, 8, device=device), torch.randn(8, 5, device=device), torch.randn(5, 4, device=device)
    for dtype in (torch.float16, torch.bfloat16):
        out = einsum("ik,kj->ij", a.to(dtype), b.to(dtype), semiring="log")
        assert out.dtype == dtype
        torch.testing.assert_close(out, so.logbmm(a.to(dtype), b.to(dtype)))
        chain = einsum("ik,kj,jl->il", a.to(dtype), b.to(dtype), c.to(dtype), semiring="log")
        torch.testing.assert_close(chain.float(), einsum("ik,kj,jl->il", a, b, c), rtol=2e-2, atol=5e-2)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        out = einsum("ik,kj->ij", a, b, semiring="log")
    torch.testing.assert_close(out.float(), einsum("ik,kj->ij", a, b), rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize(
    "equation,shapes,message",
    [
        (
            "ij,jk->ik",
            [(2, 3), (4, 5)],
            "label 'j' has size 3 in operand 0 (shape (2, 3)) but size 4 in operand 1 (shape (4, 5))",
        ),
        ("ij,jk->il", [(2, 3), (3, 5)], "output label 'l' appears in no operand"),
        ("ij->ii", [(2, 2)], "output label 'i' appears more than once"),
        ("ij,jk->ik", [(2, 3)], "2 operand(s) in the equation, 1 given"),
        ("ijk->i", [(2, 3)], "operand 0 has 2 dimension(s) (shape (2, 3)), its term names 3"),
        ("i1->i", [(2, 3)], "'1' is not a label"),
        ("ij->i->j", [(2, 3)], "more than one '->'"),
        ("......i->i", [(2, 3)], "more than one '...'"),
        ("ii->i", [(2, 3)], "label 'i' is repeated in operand 0 (shape (2, 3)) with sizes 2 and 3"),
        ("ij->...", [(2, 3)], "output '...' appears in no operand"),
    ],
)
def test_bad_equations_say_what_is_wrong(equation, shapes, message):
    with pytest.raises(ValueError) as info:
        einsum(equation, *[torch.zeros(s) for s in shapes])
    assert message in str(info.value) and equation in str(info.value)


def test_bad_operands_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"is not one of"):
        einsum("ij->i", torch.zeros(2, 2), semiring="tropical")
    with pytest.raises(TypeError, match=r"operand 1 has dtype torch\.int64"):
        einsum("i,i->", torch.zeros(2), torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match=r"operand 0 is torch\.float32, operand 1 is torch\.float64"):
        einsum("i,i->", torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="return_argmax needs a selecting semiring"):
        einsum("i,i->", torch.zeros(2), torch.zeros(2), return_argmax=True)
    with pytest.raises(ValueError, match="memory must be a positive number of bytes"):
        einsum("i,i->", torch.zeros(2), torch.zeros(2), memory=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_mixed_devices_are_refused():
    with pytest.raises(ValueError, match="operand 0 on cpu, operand 1 on cuda"):
        einsum("i,i->", torch.zeros(2), torch.zeros(2, device="cuda"))


def test_every_label_order_of_a_two_operand_equation(device):
    """'ij,jk->ik' and all its relabellings / output orders: the lowering permutes and reshapes correctly."""
    a, b = _operands([(2, 3), (3, 4)], device)
    want = brute("ij,jk->ik", [a, b], "log")
    for perm in itertools.permutations("ijk"):
        mapping = dict(zip("ijk", perm, strict=True))
        eq = "".join(mapping.get(c, c) for c in "ij,jk->ik")
        torch.testing.assert_close(einsum(eq, a, b).cpu(), want)


def test_any_strides(device):
    """Transposed, sliced (step 2) and expanded (stride 0) operands: the same as their contiguous copies."""
    base = _operands([(6, 10), (7, 5, 3), (3,)], device)
    a = base[0].t()[::2]  # (5, 6), strides (2, 10)
    b = base[1].permute(2, 1, 0)[:, :, 1:6]  # (3, 5, 5)
    c = base[2].expand(5, 3)  # stride 0
    for semiring in SEMIRINGS:
        got = einsum("ij,kil,lk->jl", a, b, c, semiring=semiring)
        want = einsum("ij,kil,lk->jl", a.contiguous(), b.contiguous(), c.contiguous(), semiring=semiring)
        torch.testing.assert_close(got, want)  # std: BLAS may add in another order for other strides
        torch.testing.assert_close(got.cpu(), brute("ij,kil,lk->jl", [a, b, c], semiring))


def test_torch_compile_fullgraph(device):
    """The whole einsum (parse, plan, steps; a memory-cut plan and return_argmax too) traced as one graph, the
    same values and gradients as eager, and a second shape recompiles correctly (dynamic=False: the plan is made
    from the sizes, which must be constants, docs/einsum.md)."""
    torch._dynamo.reset()
    x, y, z = (t.requires_grad_() for t in _operands([(3, 4), (4, 5), (5, 2)], device, dtype=torch.float32))

    def log_chain(x, y, z):
        return einsum("ij,jk,kl->il", x, y, z, semiring="log", memory=16 * 4)

    def viterbi(x, y, z):
        return einsum("ij,jk,kl->", x, y, z, semiring="max", return_argmax=True)

    compiled = torch.compile(log_chain, fullgraph=True, dynamic=False, backend="aot_eager")
    got, want = compiled(x, y, z), log_chain(x, y, z)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x), torch.autograd.grad(want.sum(), x))
    value, arg = torch.compile(viterbi, fullgraph=True, backend="aot_eager")(x, y, z)
    torch.testing.assert_close(value, viterbi(x, y, z)[0])
    assert torch.equal(arg, viterbi(x, y, z)[1])
    x2, y2, z2 = _operands([(2, 6), (6, 3), (3, 4)], device, dtype=torch.float32)
    torch.testing.assert_close(compiled(x2, y2, z2), log_chain(x2, y2, z2))


def test_the_planner_is_marked_constant_as_torch_marks_it():
    """execute.assume_constant_result sets dynamo's mark without importing torch._dynamo: the same attributes as
    torch.compiler.assume_constant_result (if torch changes how it marks, this fails)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from semiring_ops.einsum import execute\n"
        "assert 'torch._dynamo' not in sys.modules, 'importing semiring_ops imported torch._dynamo'\n"
        "ours = vars(execute.assume_constant_result(lambda: 0))\n"
        "theirs = vars(torch.compiler.assume_constant_result(lambda: 0))\n"
        "assert ours == theirs and ours, (ours, theirs)\n"
        "assert execute._plan_steps._dynamo_marked_constant\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
