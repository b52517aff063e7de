"""Which tag sequences a tagging scheme allows, as masks a CRF applies in training and decoding alike.

Labels are strings "PREFIX-TYPE" (e.g. "B-PER", "I-LOC") or "O"; a bare prefix ("B", "S") has the
empty type. Schemes:
    BIO    B begins a chunk, I continues one of the same type, O is outside.
    IOB1   I opens or continues a chunk; B only splits two adjacent chunks of the same type.
    BIOUL  B begins, I continues, L ends a multi-token chunk; U is a one-token chunk; O is outside.
    BMES   B begins, M continues, E ends a multi-token chunk; S is a one-token chunk (no O).
"""

from __future__ import annotations

from collections.abc import Sequence
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


def _parse(label: str, scheme: str) -> tuple[str, str]:
    prefix, _, kind = label.partition("-")
    allowed = set(scheme) | ({"O"} if scheme != "BMES" else set())
    if label == "O" and scheme != "BMES":
        return "O", ""
    if prefix not in allowed or prefix == "O":
        raise ValueError(f"label {label!r} does not fit the {scheme} scheme (prefixes {sorted(allowed)})")
    return prefix, kind


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


def allowed_transitions(scheme: str, labels: Sequence[str]) -> Constraints:
    """The legal starts, transitions and ends of `scheme` over `labels` (tag i is labels[i])."""
    scheme = scheme.upper()
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    parsed = [_parse(label, scheme) for label in labels]
    start = torch.tensor([_can_start(p, scheme) for p, _ in parsed])
    end = torch.tensor([_can_end(p, scheme) for p, _ in parsed])
    trans = torch.tensor([[_can_follow(a, b, scheme) for b in parsed] for a in parsed])
    return Constraints(start, trans, end)
