"""merge_tokens / TokenSpan (torchaudio.functional's): spans against a run-by-run reference, their scores to the bit,
bad input, torchaudio's own function where it imports; and the ``<star>`` token of torchaudio's forced-alignment
tutorial (an emission column of log-probability 0 that stands for a missing part of the transcript), which needs
nothing of forced_align beyond one more label."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES
from hypothesis import given, settings
from hypothesis import strategies as st

from semiring_ops import TokenSpan, forced_align, merge_tokens


def _runs(tokens: list[int], scores: torch.Tensor, blank: int) -> list[tuple[int, int, int, float]]:
    """(token, start, end, mean score) of each run of equal labels that is not the blank, by a plain loop."""
    out, start = [], 0
    for t in range(1, len(tokens) + 1):
        if t == len(tokens) or tokens[t] != tokens[start]:
            if tokens[start] != blank:
                out.append((tokens[start], start, t, scores[start:t].mean().item()))
            start = t
    return out


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), max_size=40),
    blank=st.integers(0, 4),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.int32, torch.int64]),
)
def test_spans_are_the_runs_of_non_blank_labels(tokens, blank, seed, dtype):
    scores = torch.rand(len(tokens), generator=torch.Generator().manual_seed(seed))
    spans = merge_tokens(torch.tensor(tokens, dtype=dtype), scores, blank=blank)
    assert [(s.token, s.start, s.end, s.score) for s in spans] == _runs(tokens, scores, blank)
    assert all(isinstance(s, TokenSpan) and len(s) == s.end - s.start > 0 for s in spans)


def test_a_label_after_a_blank_is_a_new_span():
    spans = merge_tokens(torch.tensor([0, 3, 3, 0, 3, 2, 2, 0]), torch.arange(8.0))
    assert [(s.token, s.start, s.end, s.score) for s in spans] == [(3, 1, 3, 1.5), (3, 4, 5, 4.0), (2, 5, 7, 5.5)]
    assert merge_tokens(torch.tensor([], dtype=torch.int32), torch.tensor([])) == []


def test_bad_input_names_the_arguments():
    with pytest.raises(ValueError, match="1-D"):
        merge_tokens(torch.zeros(1, 3, dtype=torch.int32), torch.zeros(3))
    with pytest.raises(ValueError, match="differ in length"):
        merge_tokens(torch.zeros(3, dtype=torch.int32), torch.zeros(4))


@pytest.mark.parametrize("device", DEVICES)
def test_torchaudios_merge_tokens_where_it_imports(device):
    """The same spans and scores, to the bit, on the device's tensors (each span's mean computed there)."""
    try:
        from torchaudio.functional import merge_tokens as theirs
    except Exception as exc:  # not installed, or its compiled ops refuse this torch (any error of its import)
        pytest.skip(f"torchaudio.functional does not import here: {exc}")
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 4, (200,), generator=g).to(device)
    scores = torch.rand(200, generator=g).to(device)
    assert [vars(s) for s in merge_tokens(tokens, scores)] == [vars(s) for s in theirs(tokens, scores)]


def _planted_emission(frames: dict[int, int], T: int, C: int) -> torch.Tensor:
    """(1, T, C) log-probs: probability 0.9 on the planted label of each frame (the blank where none is), the rest
    shared by the other labels."""
    labels = torch.zeros(T, dtype=torch.long)
    for t, c in frames.items():
        labels[t] = c
    probs = torch.full((T, C), 0.1 / (C - 1))
    probs[torch.arange(T), labels] = 0.9
    return probs.log()[None]


@pytest.mark.parametrize("device", DEVICES)
def test_the_star_token_absorbs_a_missing_part_of_the_transcript(device):
    """The tutorial's recipe: one more emission column of zeros (log-probability 0 at every frame) for ``*``, and
    ``*`` where the transcript lacks words. Labels 1 2 3 (a word the transcript lacks) are planted at frames 2-12,
    4 at 18-20, 5 at 23-25: with ``*`` first, the star takes every frame up to 4's last (its log-probability 0
    beats 4's log 0.9 at frames 18 and 19: the best path), then 4 (frame 20) and 5 keep their planted frames."""
    planted = {t: c for c, ts in ((1, (2, 3, 4)), (2, (6, 7, 8)), (3, (10, 11, 12))) for t in ts}
    planted |= {t: 4 for t in (18, 19, 20)} | {t: 5 for t in (23, 24, 25)}
    emission = _planted_emission(planted, T=30, C=6).to(device)
    star = emission.shape[2]
    with_star = torch.cat([emission, torch.zeros_like(emission[..., :1])], dim=2)
    alignment, scores = forced_align(with_star, torch.tensor([[star, 4, 5]], dtype=torch.int32, device=device))
    spans = merge_tokens(alignment[0], scores[0].exp())
    assert [(s.token, s.start, s.end) for s in spans] == [(star, 0, 20), (4, 20, 21), (5, 23, 26)]
    assert spans[0].score == 1.0 and abs(spans[1].score - 0.9) < 1e-6
    # the whole transcript, no star: every word at its planted frames
    alignment, scores = forced_align(emission, torch.tensor([[1, 2, 3, 4, 5]], device=device))
    spans = merge_tokens(alignment[0], scores[0].exp())
    assert [(s.token, s.start, s.end) for s in spans] == [(1, 2, 5), (2, 6, 9), (3, 10, 13), (4, 18, 21), (5, 23, 26)]
