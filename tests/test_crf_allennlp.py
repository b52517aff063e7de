"""allowed_transitions in AllenNLP's form: a {tag index: label} dict as well as a list, and the result as AllenNLP's
allowed_transitions gives it (Constraints.allennlp_pairs: (from, to) pairs, START = C, END = C + 1). The expected
pairs are written by hand from AllenNLP's rules (allennlp.modules.conditional_random_field.is_transition_allowed;
AllenNLP is not installed): from START only to the scheme's first tags, to END only from its last tags, nothing
into START or out of END, between tags the scheme's rules with "same type" meaning equal text after the prefix.
"""

from __future__ import annotations

import pytest
import torch

from semiring_ops.structures import LinearChainCRF, allowed_transitions


def _pairs(moves: dict[int, list[int]]) -> list[tuple[int, int]]:
    """{from: [to, ...]} -> AllenNLP's sorted (from, to) pairs."""
    return sorted((i, j) for i, tos in moves.items() for j in tos)


# (scheme, labels as AllenNLP passes them, what AllenNLP's allowed_transitions returns as {from: [to, ...]})
ALLENNLP_FACTS = [
    pytest.param(  # the call; START = 3, END = 4
        "BIO",
        {0: "O", 1: "B-PER", 2: "I-PER"},
        {0: [0, 1, 4], 1: [0, 1, 2, 4], 2: [0, 1, 2, 4], 3: [0, 1]},
        id="BIO",
    ),
    pytest.param(  # keys in no order; two types: I-LOC only after B-LOC / I-LOC; START = 5, END = 6
        "BIO",
        {4: "I-LOC", 0: "O", 2: "I-PER", 3: "B-LOC", 1: "B-PER"},
        {0: [0, 1, 3, 6], 1: [0, 1, 2, 3, 6], 2: [0, 1, 2, 3, 6], 3: [0, 1, 3, 4, 6], 4: [0, 1, 3, 4, 6], 5: [0, 1, 3]},
        id="BIO-unordered-keys",
    ),
    pytest.param(  # B-PER only after B-PER / I-PER; START = 4 (to O and the I's), END = 5
        "IOB1",
        {0: "O", 1: "I-PER", 2: "B-PER", 3: "I-LOC"},
        {0: [0, 1, 3, 5], 1: [0, 1, 2, 3, 5], 2: [0, 1, 2, 3, 5], 3: [0, 1, 3, 5], 4: [0, 1, 3]},
        id="IOB1",
    ),
    pytest.param(  # an open chunk (B, I) must go on (I) or close (L); END only after O, L, U; START = 5, END = 6
        "BIOUL",
        {4: "U-LOC", 0: "O", 3: "L-LOC", 1: "B-LOC", 2: "I-LOC"},
        {0: [0, 1, 4, 6], 1: [2, 3], 2: [2, 3], 3: [0, 1, 4, 6], 4: [0, 1, 4, 6], 5: [0, 1, 4]},
        id="BIOUL-unordered-keys",
    ),
    pytest.param(  # no O; M and E only inside a chunk of their type; START = 5, END = 6
        "BMES",
        {0: "B-X", 1: "M-X", 2: "E-X", 3: "S-X", 4: "S-Y"},
        {0: [1, 2], 1: [1, 2], 2: [0, 3, 4, 6], 3: [0, 3, 4, 6], 4: [0, 3, 4, 6], 5: [0, 3, 4]},
        id="BMES",
    ),
]


@pytest.mark.parametrize(("scheme", "labels", "moves"), ALLENNLP_FACTS)
def test_allennlp_labels_dict_gives_allennlp_pairs(scheme, labels, moves):
    c = allowed_transitions(scheme, labels)
    assert c.allennlp_pairs() == _pairs(moves)
    C = len(labels)
    assert c.start.shape == (C,) and c.transitions.shape == (C, C) and c.end.shape == (C,)
    # the same labels as a list (tag i's label at i) give the same masks: the list form is unchanged
    as_list = allowed_transitions(scheme, [labels[i] for i in range(C)])
    assert torch.equal(c.start, as_list.start) and torch.equal(c.end, as_list.end)
    assert torch.equal(c.transitions, as_list.transitions)


def test_the_masks_and_the_pairs_say_the_same():
    """START -> j is start[j], i -> END is end[i], i -> j is transitions[i, j]."""
    c = allowed_transitions("BIOUL", ["O", "B-X", "I-X", "L-X", "U-X", "B-Y", "L-Y"])
    C = 7
    pairs = set(c.allennlp_pairs())
    assert all(0 <= i <= C and 0 <= j <= C + 1 and j != C and i != C + 1 for i, j in pairs)
    assert (C, C + 1) not in pairs  # START -> END, an empty sequence, is not listed
    for j in range(C):
        assert ((C, j) in pairs) == bool(c.start[j]) and ((j, C + 1) in pairs) == bool(c.end[j])
        for i in range(C):
            assert ((i, j) in pairs) == bool(c.transitions[i, j])


def test_a_crf_takes_constraints_from_a_dict():
    labels = {2: "I-PER", 0: "O", 1: "B-PER"}
    crf = LinearChainCRF(3, batch_first=True, constraints=allowed_transitions("BIO", labels))
    em = torch.zeros(1, 3, 3)
    em[0, :, 2] = 5.0  # I-PER everywhere scores best, but I-PER cannot start or follow O
    tags, _ = crf.viterbi(em)
    assert tags.tolist() == [[1, 2, 2]]


def test_a_label_that_does_not_fit_the_scheme_is_an_error():
    """AllenNLP accepts it and lets nothing lead to it: for {0: "O", 1: "U-PER"} under BIO its pairs are
    [(0, 0), (0, 3), (1, 0), (2, 0)], U-PER never reachable. Ours raises, naming the label and its tag."""
    with pytest.raises(ValueError, match=r"^label 'U-PER' of tag 1 does not fit the BIO scheme"):
        allowed_transitions("BIO", {0: "O", 1: "U-PER"})
    with pytest.raises(ValueError, match=r"^label 'O' of tag 2 does not fit the BMES scheme"):
        allowed_transitions("BMES", ["B-X", "E-X", "O"])
    with pytest.raises(ValueError, match="label 'B_PER' of tag 0"):  # AllenNLP: a B of type "_PER"
        allowed_transitions("BIO", ["B_PER", "O"])
    with pytest.raises(TypeError, match=r"labels must be str, got 3 \(int\) for tag 1"):
        allowed_transitions("BIO", ["O", 3])


def test_dict_keys_must_be_the_tag_indices():
    """{0: "O", 1: "B-PER", 3: "I-PER"}: AllenNLP numbers START len(labels) = 3, I-PER's own index, so its pairs
    cannot be told apart; a CRF's tags are 0..C-1. Ours raises, listing the keys."""
    with pytest.raises(ValueError, match=r"maps each tag index 0\.\.2 to its label; got the keys \[0, 1, 3\]"):
        allowed_transitions("BIO", {0: "O", 1: "B-PER", 3: "I-PER"})
    with pytest.raises(ValueError, match=r"got the keys \['0', '1'\]"):
        allowed_transitions("BIO", {"0": "O", "1": "B-PER"})
