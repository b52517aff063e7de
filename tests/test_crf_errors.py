"""LinearChainCRF's argument errors: every public method names the argument, its shape (or dtype) and what was
expected, in the caller's layout (batch_first or not), before it reads anything; validate=False changes none of
them. The messages are checked whole."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

from semiring_ops.structures import LinearChainCRF, allowed_transitions

C = 3

# Every public method that takes emissions, as f(crf, emissions, tags, mask=, lengths=); the ones without tags
# ignore them. decode takes no lengths.
CALLS: dict[str, Callable] = {
    "forward": lambda crf, em, tags, **kw: crf(em, tags, **kw),
    "nll": lambda crf, em, tags, **kw: crf.nll(em, tags, **kw),
    "score": lambda crf, em, tags, **kw: crf.score(em, tags, **kw),
    "decode": lambda crf, em, tags, mask=None: crf.decode(em, mask),
    "viterbi": lambda crf, em, tags, **kw: crf.viterbi(em, **kw),
    "viterbi_top_k": lambda crf, em, tags, **kw: crf.viterbi(em, **kw, top_k=2),
    "marginals": lambda crf, em, tags, **kw: crf.marginals(em, **kw),
    "log_partition": lambda crf, em, tags, **kw: crf.log_partition(em, **kw),
    "entropy": lambda crf, em, tags, **kw: crf.entropy(em, **kw),
    "sample": lambda crf, em, tags, **kw: crf.sample(em, **kw, n=2),
}
WITH_TAGS = ("forward", "nll", "score")
WITH_LENGTHS = tuple(name for name in CALLS if name != "decode")


def _layout(batch_first: bool) -> tuple[str, str]:
    """The emissions' and the tags' / mask's dimension names as the messages spell them."""
    lead = "batch_size, seq_length" if batch_first else "seq_length, batch_size"
    return f"({lead}, num_tags)", f"({lead})"


def _raises(error: type[Exception], message: str):
    return pytest.raises(error, match="^" + re.escape(message) + "$")


@pytest.fixture(params=[False, True], ids=["seq_first", "batch_first"])
def batch_first(request) -> bool:
    return request.param


@pytest.fixture(params=[True, False], ids=["validate", "no_validate"])
def crf(request, batch_first) -> LinearChainCRF:
    return LinearChainCRF(C, batch_first=batch_first, validate=request.param)


def _inputs(batch_first: bool, B: int = 2, T: int = 4):
    """Good emissions, tags and mask in the CRF's layout."""
    em, tags, mask = torch.randn(B, T, C), torch.zeros(B, T, dtype=torch.long), torch.ones(B, T, dtype=torch.bool)
    if not batch_first:
        em, tags, mask = em.transpose(0, 1), tags.T, mask.T
    return em, tags, mask


@pytest.mark.parametrize("call", sorted(CALLS))
def test_emissions_of_the_wrong_rank_are_named_with_their_shape(crf, batch_first, call):
    em_layout, _ = _layout(batch_first)
    _, tags, _ = _inputs(batch_first)
    for em in (torch.randn(5, 3), torch.randn(2, 4, 3, 1), torch.tensor(1.0)):
        message = f"emissions must be 3-D {em_layout} with batch_first={batch_first}, got shape {tuple(em.shape)}"
        with _raises(ValueError, message):
            CALLS[call](crf, em, tags)


def test_the_issue_example():
    """pytorch-crf's layout, 2-D emissions: the message the issue asks for, word for word."""
    with _raises(
        ValueError, "emissions must be 3-D (seq_length, batch_size, num_tags) with batch_first=False, got shape (5, 3)"
    ):
        LinearChainCRF(3).decode(torch.randn(5, 3))


@pytest.mark.parametrize("call", sorted(CALLS))
def test_emissions_with_the_wrong_number_of_tags(crf, batch_first, call):
    em_layout, _ = _layout(batch_first)
    em, tags, _ = _inputs(batch_first)
    bad = torch.randn(*em.shape[:2], C + 2)
    message = (
        f"emissions must have shape {em_layout} = {(*em.shape[:2], C)} with batch_first={batch_first} "
        f"(this CRF has num_tags={C}), got shape {(*em.shape[:2], C + 2)}"
    )
    with _raises(ValueError, message):
        CALLS[call](crf, bad, tags)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_emissions_of_the_wrong_type_or_dtype(crf, batch_first, call):
    em, tags, _ = _inputs(batch_first)
    with _raises(TypeError, "emissions must be floating point, got torch.int64"):
        CALLS[call](crf, em.long(), tags)
    em_layout, _ = _layout(batch_first)
    with _raises(TypeError, f"emissions must be a Tensor {em_layout}, got list"):
        CALLS[call](crf, em.tolist(), tags)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_mask_that_does_not_match_the_emissions(crf, batch_first, call):
    _, seq_layout = _layout(batch_first)
    em, tags, mask = _inputs(batch_first)
    for bad in (mask.T, mask[:1], mask[:, :, None], mask.flatten()):
        message = (
            f"mask must have shape {seq_layout} = {tuple(em.shape[:2])} with batch_first={batch_first}, the first "
            f"two dimensions of emissions (shape {tuple(em.shape)}), got shape {tuple(bad.shape)}"
        )
        with _raises(ValueError, message):
            CALLS[call](crf, em, tags, mask=bad)


@pytest.mark.parametrize("call", WITH_TAGS)
def test_tags_that_do_not_match_the_emissions(crf, batch_first, call):
    _, seq_layout = _layout(batch_first)
    em, tags, _ = _inputs(batch_first)
    for bad in (tags.T, tags[:, :1], tags[..., None]):
        message = (
            f"tags must have shape {seq_layout} = {tuple(em.shape[:2])} with batch_first={batch_first}, the first "
            f"two dimensions of emissions (shape {tuple(em.shape)}), got shape {tuple(bad.shape)}"
        )
        with _raises(ValueError, message):
            CALLS[call](crf, em, bad)
    for dtype in (torch.float32, torch.bool):
        with _raises(TypeError, f"tags must be an integer tensor, got {dtype}"):
            CALLS[call](crf, em, tags.to(dtype))


@pytest.mark.parametrize("call", WITH_LENGTHS)
def test_lengths_of_the_wrong_shape_or_dtype_or_given_with_a_mask(crf, batch_first, call):
    em, tags, mask = _inputs(batch_first, B=2)
    for bad in (torch.tensor([4, 4, 4]), torch.tensor([[4, 4]]), torch.tensor(4)):
        with _raises(ValueError, f"lengths must have shape (batch_size,) = (2,), got shape {tuple(bad.shape)}"):
            CALLS[call](crf, em, tags, lengths=bad)
    with _raises(TypeError, "lengths must be an integer tensor, got torch.float32"):
        CALLS[call](crf, em, tags, lengths=torch.tensor([4.0, 3.0]))
    with _raises(ValueError, "give mask or lengths, not both"):
        CALLS[call](crf, em, tags, mask=mask, lengths=torch.tensor([4, 3]))


def test_counts_reduction_and_num_tags():
    crf = LinearChainCRF(C, batch_first=True)
    em, tags, _ = _inputs(True)
    with _raises(ValueError, "top_k must be at least 1, got 0"):
        crf.viterbi(em, top_k=0)
    with _raises(TypeError, "top_k must be an int, got 2.0"):
        crf.viterbi(em, top_k=2.0)
    with _raises(ValueError, "n must be at least 0, got -1"):
        crf.sample(em, n=-1)
    with _raises(ValueError, "invalid reduction: avg (must be one of none, sum, mean, token_mean)"):
        crf(em, tags, reduction="avg")
    with _raises(ValueError, "invalid number of tags: 0 (num_tags must be positive)"):
        LinearChainCRF(0)
    with _raises(TypeError, "num_tags must be an int, got 2.5"):
        LinearChainCRF(2.5)
    c = allowed_transitions("BIO", ["O", "B-X", "I-X"])
    with _raises(
        ValueError,
        "constraints must have start, transitions, end of shapes ((4,), (4, 4), (4,)) for num_tags=4, "
        "got ((3,), (3, 3), (3,))",
    ):
        LinearChainCRF(4, constraints=c)


def test_good_inputs_still_work_in_both_layouts(batch_first):
    """The checks run in the caller's layout: seq-first inputs pass them and give the batch-first results."""
    crf = LinearChainCRF(C, batch_first=batch_first)
    ref = LinearChainCRF(C, batch_first=True)
    ref.load_state_dict(crf.state_dict())
    em, tags, mask = _inputs(batch_first, B=3, T=5)
    mask = mask.clone()
    mask[-1, -1] = False  # the last step of the last (seq-first: of every) sequence off
    em_b, tags_b, mask_b = (x if batch_first else x.transpose(0, 1) for x in (em, tags, mask))
    lengths = mask_b.sum(1)
    torch.testing.assert_close(crf(em, tags, mask), ref(em_b, tags_b, mask_b))
    torch.testing.assert_close(crf(em, tags, lengths=lengths.tolist()), ref(em_b, tags_b, lengths=lengths))
    assert crf.decode(em, mask) == ref.decode(em_b, mask_b)
