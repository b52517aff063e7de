"""Which tag sequences a tagging scheme allows, as masks a CRF applies in training and decoding alike.

Labels are strings "PREFIX-TYPE" (e.g. "B-PER", "I-LOC") or "O"; a bare prefix ("B", "S") has the
empty type. Schemes:
    BIO    B begins a chunk, I continues one of the same type, O is outside.
    IOB1   I opens or continues a chunk; B only splits two adjacent chunks of the same type.
    BIOUL  B begins, I continues, L ends a multi-token chunk; U is a one-token chunk; O is outside.
    BMES   B begins, M continues, E ends a multi-token chunk; S is a one-token chunk (no O).

The rules are AllenNLP's (allennlp.modules.conditional_random_field.allowed_transitions), and its form of the
labels, a {tag index: label} dict, is accepted beside a list; ``Constraints.allennlp_pairs`` gives the result in
AllenNLP's form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["SCHEMES", "Constraints", "allowed_transitions"]

SCHEMES = ("BIO", "IOB1", "BIOUL", "BMES")


@dataclass(frozen=True)
class Constraints:
    """Boolean masks over C tags: start (C,), transitions (C, C) [from, to], end (C,)."""

    start: Tensor
    transitions: Tensor
    end: Tensor

    def allennlp_pairs(self) -> list[tuple[int, int]]:
        """The allowed moves as AllenNLP's allowed_transitions lists them: (from, to) pairs over C + 2 indices, the
        tags 0..C-1, START = C and END = C + 1, sorted. (i, j) for tags is transitions[i, j], (START, j) is
        start[j], (i, END) is end[i]; nothing goes into START or out of END, and START -> END (an empty sequence)
        is not listed. AllenNLP's ConditionalRandomField(C, constraints=...) takes this list."""
        C = self.start.shape[0]
        pairs = [(i, j) for i, j in self.transitions.nonzero().tolist()]
        pairs += [(C, j) for j in self.start.nonzero().flatten().tolist()]
        pairs += [(i, C + 1) for i in self.end.nonzero().flatten().tolist()]
        return sorted(pairs)


def _parse(index: int, label: str, scheme: str) -> tuple[str, str]:
    """Tag `index`'s label -> (prefix, type), or ValueError if the scheme has no such label."""
    if not isinstance(label, str):
        raise TypeError(f"labels must be str, got {label!r} ({type(label).__name__}) for tag {index}")
    prefix, _, kind = label.partition("-")
    allowed = set(scheme) | ({"O"} if scheme != "BMES" else set())
    if label == "O" and scheme != "BMES":
        return "O", ""
    if prefix not in allowed or prefix == "O":
        raise ValueError(
            f"label {label!r} of tag {index} does not fit the {scheme} scheme (prefixes {sorted(allowed)})"
        )
    return prefix, kind


def _in_tag_order(labels: Sequence[str] | Mapping[int, str]) -> list[str]:
    """The labels as a list, tag i's label at i: a sequence as it is, a {tag index: label} dict (AllenNLP's
    form, any order) whose keys must be exactly 0..n-1, the tags of a CRF over n tags."""
    if not isinstance(labels, Mapping):
        return list(labels)
    keys = list(labels)
    if any(isinstance(k, bool) or not isinstance(k, int) for k in keys) or sorted(keys) != list(range(len(keys))):
        raise ValueError(f"a labels dict maps each tag index 0..{len(keys) - 1} to its label; got the keys {keys}")
    return [labels[i] for i in range(len(keys))]


def _can_start(p: str, scheme: str) -> bool:
    return {"BIO": p in "BO", "IOB1": p in "IO", "BIOUL": p in "BUO", "BMES": p in "BS"}[scheme]


def _can_end(p: str, scheme: str) -> bool:
    return {"BIO": True, "IOB1": True, "BIOUL": p in "LUO", "BMES": p in "ES"}[scheme]


def _can_follow(prev: tuple[str, str], nxt: tuple[str, str], scheme: str) -> bool:
    (p, t), (q, u) = prev, nxt
    same = t == u
    if scheme == "BIO":
        return q in "BO" or (q == "I" and p in "BI" and same)
    if scheme == "IOB1":
        return q in "IO" or (q == "B" and p in "BI" and same)
    if scheme == "BIOUL":
        inside = p in "BI"  # a chunk is open: it must continue (I) or close (L), with the same type
        return (q in "IL" and same) if inside else q in "BUO"
    inside = p in "BM"  # BMES
    return (q in "ME" and same) if inside else q in "BS"


def allowed_transitions(scheme: str, labels: Sequence[str] | Mapping[int, str]) -> Constraints:
    """The legal starts, transitions and ends of `scheme` over C tags -> Constraints, masks start (C,),
    transitions (C, C) [from, to] and end (C,).

    labels: tag i's label is labels[i]: a list of C labels, or AllenNLP's {tag index: label} dict over the tags
    0..C-1 in any order. The rules are AllenNLP's; its allowed_transitions returns (from, to) pairs with START =
    C and END = C + 1 instead of masks, which ``Constraints.allennlp_pairs()`` gives. One difference: a label
    that does not fit the scheme ("U-PER" under BIO, "O" under BMES, "B_PER" anywhere) raises ValueError here.
    AllenNLP reads a label's first character as its prefix and the rest as its type, so it takes "B_PER" as a B
    of type "_PER", and lets no start or transition lead to a tag whose prefix the scheme lacks (that tag is
    never used).
    """
    scheme = scheme.upper()
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    parsed = [_parse(i, label, scheme) for i, label in enumerate(_in_tag_order(labels))]
    start = torch.tensor([_can_start(p, scheme) for p, _ in parsed])
    end = torch.tensor([_can_end(p, scheme) for p, _ in parsed])
    trans = torch.tensor([[_can_follow(a, b, scheme) for b in parsed] for a in parsed])
    return Constraints(start, trans, end)
