"""LinearChainCRF.forward in one C++ call (csrc/autograd/crf_forward.cpp): on the arguments it takes, the same numbers,
gradients and errors as the Python path it replaces (which runs for everything it declines), and it is taken; on the
CPU and on a GPU. Its reductions happen inside the log-likelihood's node (csrc/autograd/chain_autograd.cpp), whose
derivatives are checked here by finite differences."""

from __future__ import annotations

import pytest
import torch
from conftest import CUDA
from hypothesis import given
from hypothesis import strategies as st

from semiring_ops.build import backends
from semiring_ops.structures import LinearChainCRF
from semiring_ops.structures.constraints import allowed_transitions

REDUCTIONS = ("none", "sum", "mean", "token_mean")


def _skip_without_one_call(device: str) -> None:
    """Skips where the chain family has no crf_forward (the PyTorch reference)."""
    if backends.backend_for(torch.device(device)).autograd_node("chain", "crf_forward", wait=True) is None:
        pytest.skip(f"no compiled {device} chain family")


@pytest.fixture
def one_call():
    _skip_without_one_call("cpu")


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


@pytest.mark.parametrize("device", ["cpu", CUDA])
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
def test_one_call_equals_the_python_path(device, B, T, C, batch_first, how, reduction, validate, dtype):
    _skip_without_one_call(device)
    gen = torch.Generator().manual_seed(B * 1000 + T * 100 + C)
    crf = LinearChainCRF(C, batch_first=batch_first, validate=validate).double()
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_(generator=gen)
    crf = crf.to(device)
    em = torch.randn(B, T, C, generator=gen).to(device, dtype).requires_grad_()
    tags = torch.randint(0, C, (B, T), generator=gen).to(device)
    lengths = torch.randint(0, T + 1, (B,), generator=gen).to(device)
    mask = torch.arange(T, device=device)[None, :] < lengths[:, None]
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


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_reduced_node_gradcheck(one_call, reduction):
    """The reductions inside the node: derivatives by finite differences (float64), ragged lengths (token_mean divides
    by their sum), emissions and all three transition tensors. (Second derivatives: the CRF has none on either path;
    semiring_ops::chain_log_backward registers no autograd formula.)"""
    gen = torch.Generator().manual_seed(7)
    crf = LinearChainCRF(3, batch_first=True).double()
    tags = torch.randint(0, 3, (3, 4), generator=gen)
    lengths = torch.tensor([4, 2, 1])

    def loss(em, trans, start, end):
        params = {"transitions": trans, "start_transitions": start, "end_transitions": end}
        return torch.func.functional_call(crf, params, (em, tags), {"lengths": lengths, "reduction": reduction})

    inputs = tuple(
        torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_()
        for shape in ((3, 4, 3), (3, 3), (3,), (3,))
    )
    with pytest.MonkeyPatch.context() as mp:
        _no_python_path(mp)
        assert torch.autograd.gradcheck(loss, inputs)


def test_one_call_declines_mixed_devices(one_call):
    """Tensors on two devices (here a meta tensor beside CPU ones) go to the Python path, which raises."""
    crf = LinearChainCRF(3, batch_first=True)
    with pytest.raises((RuntimeError, ValueError, NotImplementedError)):
        crf(torch.randn(2, 4, 3, device="meta"), torch.zeros(2, 4, dtype=torch.long))


def test_node_refuses_an_unknown_reduction(one_call):
    """The node's reduction code (0 none, 1 sum, 2 mean, 3 token_mean): anything else raises, naming it."""
    node = backends.backend_for(torch.device("cpu")).autograd_node("chain", "crf_log_likelihood_autograd", wait=True)
    em, trans, start, end = torch.randn(1, 2, 3), torch.randn(3, 3), torch.randn(3), torch.randn(3)
    lengths, tags = torch.tensor([2]), torch.tensor([[0, 2]])
    for reduction in (-1, 4):
        with pytest.raises(RuntimeError, match=f"reduction must be 0-3, got {reduction}"):
            node(em, trans, start, end, lengths, tags, reduction)
    assert node(em, trans, start, end, lengths, tags, 1)[0].dim() == 0
