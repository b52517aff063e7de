"""Formulas and plans back from their keys.

A canonical formula's key (``Formula.key``) names every node as ``{op}{params}({children' keys})``, e.g.
``Exp(Neg(Sum(Square(Sub(Vi0:3(),Vj1:3())))))``, a repeated sub-formula as ``@n`` (the n-th node completed, a
closing parenthesis, counting from 0: ``Mul(Sub(Vi0:1(),Num0()),@2)``; numbers are ``Num{k}``, entries of the
number vector passed with the variables), and a plan's key adds the reduction, the outer category and
whether indices are tracked (``Plan.key``). The key is therefore a complete description of a kernel: the
registered operator ``semiring_ops::lazy_reduce`` takes a plan as its key, and a graph that torch.compile
traced holds only strings and tensors.

Only keys of canonical formulas parse: their variables are slots (``Vi0:3``), not tensors (``Vi#7f..:3``).
"""

from __future__ import annotations

from . import formula as F
from . import formula_math
from .formula import Formula, FormulaError

__all__ = ["parse_formula"]


def _node_classes() -> dict[str, type[Formula]]:
    """op -> class, for every formula node class of formula.py and formula_math.py (``_Dim``, a checking
    stand-in, excluded)."""
    modules = (F.__name__, formula_math.__name__)
    found: dict[str, type[Formula]] = {}
    todo = [Formula]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__ in modules and cls.op and not cls.op.startswith("_"):
            if found.get(cls.op, cls) is not cls:
                raise AssertionError(f"two formula classes share the op {cls.op!r}")
            found[cls.op] = cls
    return found


_CLASSES = _node_classes()
_OPS_LONGEST_FIRST = sorted(_CLASSES, key=len, reverse=True)  # "Cos" before "C" (a constant)


def _op_at(key: str, pos: int) -> str:
    for op in _OPS_LONGEST_FIRST:
        if key.startswith(op, pos):
            return op
    raise FormulaError(f"formula key {key[:200]!r}: no operation at position {pos}")


def parse_formula(key: str) -> Formula:
    """The canonical formula whose key is ``key``; ``parse_formula(f.key).key == f.key``, a ``@n`` being the
    same node object as the n-th completed one. Iterative and linear in the key's length, so a formula
    thousands of nodes deep parses. Raises FormulaError on a malformed key."""
    # a stack of open nodes: (class, params, children parsed so far)
    stack: list[tuple[type[Formula], str, list[Formula]]] = []
    completed: list[Formula] = []  # the nodes in the order of their closing parentheses: @n is completed[n]
    pos, n = 0, len(key)
    done: Formula | None = None
    while pos < n:
        if key[pos] == "@":  # a sub-formula written before
            end = pos + 1
            while end < n and key[end].isdigit():
                end += 1
            ref = int(key[pos + 1 : end]) if end > pos + 1 else -1
            if not stack or not 0 <= ref < len(completed):
                raise FormulaError(f"formula key {key[:200]!r}: bad reference {key[pos:end]!r} at position {pos}")
            stack[-1][2].append(completed[ref])
            pos = end + (1 if end < n and key[end] == "," else 0)
            continue
        if key[pos] == ")":  # the innermost open node is complete
            if not stack:
                raise FormulaError(f"formula key {key[:200]!r}: unbalanced ')' at position {pos}")
            cls, params, children = stack.pop()
            try:
                node = cls.from_params(params, children)
            except (ValueError, TypeError, IndexError) as e:
                raise FormulaError(f"formula key {key[:200]!r}: bad node {cls.op}{params} ({e})") from e
            completed.append(node)
            pos += 1
            if stack:
                stack[-1][2].append(node)
                if pos < n and key[pos] == ",":
                    pos += 1
            else:
                done = node
                break
            continue
        op = _op_at(key, pos)
        open_at = key.find("(", pos + len(op))
        if open_at < 0:
            raise FormulaError(f"formula key {key[:200]!r}: '(' expected after {op!r} at position {pos}")
        stack.append((_CLASSES[op], key[pos + len(op) : open_at], []))
        pos = open_at + 1
    if done is None or pos != n:
        raise FormulaError(f"formula key {key[:200]!r} is incomplete or has trailing text")
    return done
