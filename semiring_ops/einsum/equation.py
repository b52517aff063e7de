"""Einsum equations in torch.einsum's grammar, parsed once and bound to operand shapes.

    "bik,bkj->bij"      explicit output
    "ij,jk"             implicit output: the labels used exactly once, in alphabetical (ASCII) order
    "...ij,...jk->...ik" an ellipsis: the unlabelled dimensions, broadcast right-aligned across operands
    "ii->i", "ii->"     a label repeated within an operand: its diagonal

Labels are ASCII letters; spaces are ignored. Sizes broadcast: every operand dimension of one label has the same
size, or size 1. A label in no output position is summed (with the semiring's plus); an output label must come from
some operand and appear once in the output.

The dimensions an ellipsis stands for get labels of their own, ``…0`` for the rightmost one, ``…1`` left of it and
so on, so the planner treats them like any other label.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BoundEquation", "ParsedEquation", "bind", "parse"]

ELLIPSIS = "..."


@dataclass(frozen=True)
class ParsedEquation:
    """An equation with its terms split; ``ellipsis`` marks where each term's ``...`` stands (None: none)."""

    source: str
    terms: tuple[tuple[str, ...], ...]  # per operand, its labels in order ("..." as one entry)
    output: tuple[str, ...] | None  # None: implicit


@dataclass(frozen=True)
class BoundEquation:
    """An equation bound to its operands' shapes: every dimension of every operand labelled.

    ``inputs[i][d]`` labels dimension d of operand i; ``output`` labels the result's dimensions; ``sizes`` maps each
    label to its broadcast size; ``summed`` lists the labels not in the output in order of first appearance.
    """

    source: str
    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]
    sizes: dict[str, int]
    summed: tuple[str, ...]


def _fail(source: str, message: str) -> ValueError:
    return ValueError(f"einsum: equation {source!r}: {message}")


def _split_term(source: str, term: str, where: str) -> tuple[str, ...]:
    labels: list[str] = []
    rest = term
    while rest:
        if rest.startswith(ELLIPSIS):
            if ELLIPSIS in labels:
                raise _fail(source, f"{where} {term!r} has more than one '...'")
            labels.append(ELLIPSIS)
            rest = rest[3:]
            continue
        char = rest[0]
        if not (char.isascii() and char.isalpha()):
            raise _fail(source, f"{where} {term!r}: {char!r} is not a label (labels are the letters a-z and A-Z)")
        labels.append(char)
        rest = rest[1:]
    return tuple(labels)


@functools.lru_cache(maxsize=1024)
def parse(equation: str) -> ParsedEquation:
    """The equation's terms; ValueError naming what is malformed."""
    if not isinstance(equation, str):
        raise TypeError(f"einsum: the equation must be a str, got {type(equation).__name__}")
    compact = equation.replace(" ", "")
    if compact.count("->") > 1:
        raise _fail(equation, "more than one '->'")
    lhs, arrow, rhs = compact.partition("->")
    if "-" in lhs or ">" in lhs or "-" in rhs or ">" in rhs:
        raise _fail(equation, "a stray '-' or '>' (the output is introduced by '->')")
    terms = tuple(_split_term(equation, term, f"operand {i}") for i, term in enumerate(lhs.split(",")))
    output = None
    if arrow:
        if "," in rhs:
            raise _fail(equation, "the output has a ','")
        output = _split_term(equation, rhs, "the output")
        seen: set[str] = set()
        for label in output:
            if label in seen:
                raise _fail(equation, f"output label {label!r} appears more than once")
            seen.add(label)
        used = {label for term in terms for label in term}
        for label in output:
            if label not in used:
                what = "'...'" if label == ELLIPSIS else f"label {label!r}"
                raise _fail(equation, f"output {what} appears in no operand")
    return ParsedEquation(equation, terms, output)


def _ellipsis_labels(rank: int) -> tuple[str, ...]:
    return tuple(f"…{i}" for i in range(rank - 1, -1, -1))


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


@functools.lru_cache(maxsize=1024)
def bind_cached(parsed: ParsedEquation, shapes: tuple[tuple[int, ...], ...]) -> BoundEquation:
    """bind, remembered for the last 1024 (equation, shapes) pairs (eager calls; the result is never mutated)."""
    return bind(parsed, shapes)


def bind(parsed: ParsedEquation, shapes: Sequence[Sequence[int]]) -> BoundEquation:
    """The equation's labels for operands of these shapes; ValueError for a wrong number of operands or dimensions
    and for label sizes that disagree (naming the label, both operands and both sizes)."""
    source = parsed.source
    if len(shapes) != len(parsed.terms):
        raise _fail(source, f"{len(parsed.terms)} operand(s) in the equation, {len(shapes)} given")
    inputs: list[tuple[str, ...]] = []
    ellipsis_rank = 0
    for i, (term, shape) in enumerate(zip(parsed.terms, shapes, strict=True)):
        named = len(term) - (ELLIPSIS in term)
        if ELLIPSIS in term:
            if len(shape) < named:
                raise _fail(
                    source, f"operand {i} of shape {_shape(shape)} has fewer dimensions than its {named} labels"
                )
            rank = len(shape) - named
            ellipsis_rank = max(ellipsis_rank, rank)
            at = term.index(ELLIPSIS)
            term = (*term[:at], *_ellipsis_labels(rank), *term[at + 1 :])
        elif len(shape) != named:
            raise _fail(
                source, f"operand {i} has {len(shape)} dimension(s) (shape {_shape(shape)}), its term names {named}"
            )
        inputs.append(term)
    sizes: dict[str, int] = {}
    where: dict[str, tuple[int, int]] = {}  # label -> (operand, size) of the first size > 1 seen
    for i, (labels, shape) in enumerate(zip(inputs, shapes, strict=True)):
        for d, (label, size) in enumerate(zip(labels, shape, strict=True)):
            size = int(size)
            if label in labels[:d]:  # a repeated label (a diagonal) takes one size within its operand
                first = shape[labels.index(label)]
                if int(first) != size:
                    raise _fail(
                        source,
                        f"label {label!r} is repeated in operand {i} (shape {_shape(shape)}) with sizes {first} and "
                        f"{size}: a diagonal needs equal sizes",
                    )
            known = sizes.get(label)
            if known is None or known == 1:
                sizes[label] = size
                if size != 1:
                    where[label] = (i, size)
            elif size not in (1, known):
                j, _ = where[label]
                raise _fail(
                    source,
                    f"label {label!r} has size {known} in operand {j} (shape {_shape(shapes[j])}) but size {size} "
                    f"in operand {i} (shape {_shape(shape)})",
                )
    if parsed.output is None:  # implicit: the ellipsis, then the labels used once, alphabetically
        counts: dict[str, int] = {}
        for labels in inputs:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        once = sorted(label for label, n in counts.items() if n == 1 and not label.startswith("…"))
        output = (*_ellipsis_labels(ellipsis_rank), *once)
    else:
        output = []
        for label in parsed.output:
            output.extend(_ellipsis_labels(ellipsis_rank) if label == ELLIPSIS else (label,))
        output = tuple(output)
    summed: list[str] = []
    for labels in inputs:
        for label in labels:
            if label not in output and label not in summed:
                summed.append(label)
    return BoundEquation(source, tuple(inputs), output, sizes, tuple(summed))
