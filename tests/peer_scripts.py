"""Running a peer's scripts on semiring_ops: the import lines swapped, nothing else changed (the hmmlearn examples,
KeOps's PyTorch and NumPy tutorials)."""

from __future__ import annotations

import re
from collections.abc import Sequence


def swap_imports(text: str, package: str, swaps: Sequence[tuple[str, str]]) -> str:
    """text with every import line naming `package` rewritten by the first (pattern, replacement) of `swaps`
    that matches it. An import line naming `package` that no swap rewrites, a script with none, or an import of
    `package` left in the result fails the test."""
    lines = text.splitlines(keepends=True)
    swapped = 0
    for index, line in enumerate(lines):
        if package not in line or not line.lstrip().startswith(("from ", "import ")):
            continue
        for pattern, replacement in swaps:
            new, count = re.subn(pattern, replacement, line.rstrip("\n"))
            if count:
                lines[index] = new + "\n"
                swapped += 1
                break
        else:
            raise AssertionError(f"import line not swapped: {line!r}")
    assert swapped, f"no {package} import found"
    result = "".join(lines)
    assert not re.search(rf"^\s*(from|import)\s+{package}\b", result, re.MULTILINE), f"{package} still imported"
    return result
