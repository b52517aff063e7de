"""LinearChainCRF.forward in one C++ call (csrc/autograd/crf_forward.cpp): on the arguments it takes, the same numbers,
gradients and errors as the Python path it replaces (which runs for everything it declines), and it is taken."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from semiring_ops.build import backends
from semiring_ops.structures import LinearChainCRF
from semiring_ops.structures.constraints import allowed_transitions

REDUCTIONS = ("none", "sum", "mean", "token_mean")


@pytest.fixture
def one_call():
    """Skips where the chain family has no crf_forward (the PyTorch reference)."""
    if backends.backend_for(torch.device("cpu")).autograd_node("chain", "crf_forward") is None:
        pytest.skip("no compiled CPU chain family")


def _python_path(monkeypatch) -> None:
    """LinearChainCRF.forward without the one call: the Python path, the reference."""
    original = backends.Backend.autograd_node

    def without(self, family, name):
        return None if name == "crf_forward" else original(self, family, name)

    monkeypatch.setattr(backends.Backend, "autograd_node", without)


def _no_python_path(monkeypatch) -> None:
    """Fails a test if the Python path runs (the one call declined)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the Python path ran")

    monkeypatch.setattr(LinearChainCRF, "_inputs", refuse)


def _loss_and_grads(crf, em, tags, kwargs, reduction):
    out = crf(em, tags, reduction=reduction, **kwargs)
    leaves = [x for x in (em, *crf.parameters()) if x.requires_grad]
    grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True) if out.requires_grad else ()
    return out, grads


@given(
    B=st.integers(0, 4),
    T=st.integers(0, 6),
    C=st.integers(1, 5),
    batch_first=st.booleans(),
    how=st.sampled_from(["none", "mask", "uint8 mask", "lengths"]),
    reduction=st.sampled_from(REDUCTIONS),
    validate=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32, torch.float16]),
)
def test_one_call_equals_the_python_path(one_call, B, T, C, batch_first, how, reduction, validate, dtype):
    gen = torch.Generator().manual_seed(B * 1000 + T * 100 + C)
    crf = LinearChainCRF(C, batch_first=batch_first, validate=validate).double()
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_(generator=gen)
    em = torch.randn(B, T, C, generator=gen).to(dtype).requires_grad_()
    tags = torch.randint(0, C, (B, T), generator=gen)
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    kwargs = {
        "none": {},
        "mask": {"mask": mask},
        "uint8 mask": {"mask": mask.to(torch.uint8)},
        "lengths": {"lengths": lengths},
    }[how]
    if not batch_first:
        em_in, tags_in = em.transpose(0, 1), tags.t()
        kwargs = {k: (v.t() if k == "mask" else v) for k, v in kwargs.items()}
    else:
        em_in, tags_in = em, tags
    with pytest.MonkeyPatch.context() as mp:
        _no_python_path(mp)
        got, got_grads = _loss_and_grads(crf, em_in, tags_in, kwargs, reduction)
    with pytest.MonkeyPatch.context() as mp:
        _python_path(mp)
        want, want_grads = _loss_and_grads(crf, em_in, tags_in, kwargs, reduction)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True)
    for x, y in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(x, y, equal_nan=True)


def test_bad_data_raises_the_same_error(one_call, monkeypatch):
    crf = LinearChainCRF(3, batch_first=True)
    em, tags = torch.randn(2, 4, 3), torch.tensor([[0, 1, 2, 3], [0, 0, 0, 0]])  # tag 3 out of range
    with pytest.raises(ValueError) as one:
        crf(em, tags)
    _python_path(monkeypatch)
    with pytest.raises(ValueError) as python:
        crf(em, tags)
    assert str(one.value) == str(python.value)
    crf.validate = False  # no raise: that sequence's log-likelihood is NaN, the other's finite
    llh = crf(em, tags, reduction="none")
    assert llh[0].isnan() and llh[1].isfinite()


def test_declined_calls_take_the_python_path(one_call):
    """Lists, masks of other dtypes, a constrained CRF: the Python path runs (and accepts them, as before)."""
    crf = LinearChainCRF(3, batch_first=True)
    em, tags = torch.randn(2, 4, 3), torch.randint(0, 3, (2, 4))
    want = crf(em, tags)
    torch.testing.assert_close(crf(em, tags.tolist()), want)
    torch.testing.assert_close(crf(em, tags, mask=torch.ones(2, 4, dtype=torch.int32)), want)
    constrained = LinearChainCRF(
        3, batch_first=True, constraints=allowed_transitions("BIO", {0: "O", 1: "B-X", 2: "I-X"})
    )
    assert torch.isfinite(constrained(em, torch.zeros(2, 4, dtype=torch.long)))


def test_shape_errors_keep_their_messages(one_call):
    crf = LinearChainCRF(3)
    with pytest.raises(ValueError, match=r"emissions must be 3-D \(seq_length, batch_size, num_tags\)"):
        crf(torch.randn(4, 3), torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="tags must have shape"):
        crf(torch.randn(4, 2, 3), torch.zeros(2, 4, dtype=torch.long))


def test_parametrized_and_functional_parameters(one_call, monkeypatch):
    """The one call reads the parameters as forward does (a parametrization's value, functional_call's tensors)."""
    crf = LinearChainCRF(3, batch_first=True)
    em, tags = torch.randn(2, 4, 3), torch.randint(0, 3, (2, 4))
    other = {"transitions": torch.randn(3, 3), "start_transitions": torch.randn(3), "end_transitions": torch.randn(3)}
    got = torch.func.functional_call(crf, other, (em, tags))

    class Doubled(torch.nn.Module):
        def forward(self, x):
            return 2 * x

    torch.nn.utils.parametrize.register_parametrization(crf, "transitions", Doubled())
    got_doubled = crf(em, tags)
    got_doubled.backward()
    grad = crf.parametrizations.transitions.original.grad.clone()
    crf.zero_grad()
    _python_path(monkeypatch)
    torch.nn.utils.parametrize.remove_parametrizations(crf, "transitions", leave_parametrized=False)
    torch.testing.assert_close(got, torch.func.functional_call(crf, other, (em, tags)))
    torch.nn.utils.parametrize.register_parametrization(crf, "transitions", Doubled())
    want_doubled = crf(em, tags)
    want_doubled.backward()
    torch.testing.assert_close(got_doubled, want_doubled)
    torch.testing.assert_close(grad, crf.parametrizations.transitions.original.grad)
