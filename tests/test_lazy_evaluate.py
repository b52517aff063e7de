"""formula.evaluate's in-place mode (``owned_slots``, used by the linear route on its blocks' matrices): the same
values as the out-of-place evaluation, the owned tensors' memory reused, and nothing else ever written: not the
caller's tensors, not a slot read twice, not under autograd."""

from __future__ import annotations

import pytest
import torch

from semiring_ops.lazy.formula import Add, Const, Div, Exp, Extract, Mul, Neg, Sub, Var, VecSum, evaluate

OWNED = -3


def _reader(tensors: dict[int, torch.Tensor]):
    return lambda var: tensors[var.slot]


def test_an_owned_block_is_overwritten_in_place_with_the_out_of_place_values():
    g = torch.rand(6, 5, 1) * 10
    b = torch.randn(1, 5, 1)
    block = Var("i", 1, slot=OWNED)
    cell = Exp(Div(Neg(block), Const(4.0)))
    want = evaluate(cell, _reader({OWNED: g.clone()}), g)
    owned = g.clone()
    got = evaluate(cell, _reader({OWNED: owned}), g, owned_slots=frozenset({OWNED}))  # grad mode on, none needed
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got.data_ptr() == owned.data_ptr(), "every node wrote into the owned block"
    other = Var("j", 1, slot=1)
    user = b.clone()
    with torch.no_grad():
        got = evaluate(Mul(Exp(other), block), _reader({OWNED: g.clone(), 1: user}), g, owned_slots=frozenset({OWNED}))
    torch.testing.assert_close(user, b, rtol=0, atol=0)  # a variable that is not owned is never written
    torch.testing.assert_close(got, b.exp() * g, rtol=0, atol=0)


def test_a_slot_read_twice_and_the_callers_tensors_are_never_written():
    g = torch.rand(4, 3, 1) + 1
    twice = Sub(Neg(Var("i", 1, slot=OWNED)), Exp(Var("i", 1, slot=OWNED)))  # two nodes, one slot
    owned = g.clone()
    with torch.no_grad():
        got = evaluate(twice, _reader({OWNED: owned}), g, owned_slots=frozenset({OWNED}))
    torch.testing.assert_close(got, -g - g.exp(), rtol=0, atol=0)
    torch.testing.assert_close(owned, g, rtol=0, atol=0)
    # a node handing its operand through unchanged (a full Extract is a view) must not pass a caller's tensor on
    x = torch.randn(4, 3, 2)
    user = x.clone()
    f = Neg(VecSum(Extract(Var("i", 2, slot=0), 0, 2)))
    with torch.no_grad():
        got = evaluate(f, _reader({0: user, OWNED: g.clone()}), g, owned_slots=frozenset({OWNED}))
    torch.testing.assert_close(user, x, rtol=0, atol=0)
    torch.testing.assert_close(got, -x.sum(-1, keepdim=True), rtol=0, atol=0)


def test_under_autograd_nothing_is_written_in_place():
    """An operand that requires grad (the block itself, or a variable beside it) keeps every node out of place:
    autograd records no out= operation, and a saved operand must keep its value."""
    g = (torch.rand(3, 4, 1) + 1).requires_grad_()
    cell = Exp(Neg(Var("i", 1, slot=OWNED)))
    got = evaluate(cell, _reader({OWNED: g}), g, owned_slots=frozenset({OWNED}))
    (grad,) = torch.autograd.grad(got.sum(), g)
    torch.testing.assert_close(grad, -torch.exp(-g.detach()))
    block, w = torch.rand(3, 4, 1) + 1, torch.rand(1, 4, 1).requires_grad_()
    owned = block.clone()
    cell = Mul(Exp(Var("i", 1, slot=OWNED)), Var("j", 1, slot=1))
    got = evaluate(cell, _reader({OWNED: owned, 1: w}), block, owned_slots=frozenset({OWNED}))
    (gw,) = torch.autograd.grad(got.sum(), w)
    torch.testing.assert_close(gw, block.exp().sum(0, keepdim=True))


def test_a_negation_times_a_number_is_folded_into_the_number(monkeypatch):
    """-D / d and -D * w (a number): the reader takes the number's negative, the negation is never made (one pass
    over the block fewer), the values bit for bit the out-of-place ones; a negation read twice is still made."""
    from semiring_ops.lazy.formula import Num

    g = torch.rand(5, 4, 1) * 10
    numbers = torch.tensor([0.5, 3.0])
    block = Var("i", 1, slot=OWNED)
    cells = [Exp(Div(Neg(block), Const(4.0))), Mul(Neg(block), Num(1)), Div(Neg(block), Num(0))]
    wants = [evaluate(cell, _reader({OWNED: g.clone()}), g, numbers) for cell in cells]

    def boom(x, out=None):
        raise AssertionError("the negation was made")

    monkeypatch.setattr(Neg, "tfun", staticmethod(boom))
    for cell, want in zip(cells, wants, strict=True):
        owned = g.clone()
        got = evaluate(cell, _reader({OWNED: owned}), g, numbers, owned_slots=frozenset({OWNED}))
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert got.data_ptr() == owned.data_ptr()
    neg = Neg(block)
    with pytest.raises(AssertionError, match="the negation was made"):
        evaluate(Add(Div(neg, Const(2.0)), neg), _reader({OWNED: g.clone()}), g, owned_slots=frozenset({OWNED}))
