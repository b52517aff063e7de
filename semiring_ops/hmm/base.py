"""hmmlearn.base's public names, where hmmlearn's users import them from (``from hmmlearn.base import ...``).

``VariationalBaseHMM`` (variational/) is imported on first use, so this module never depends on it being there.
"""

from __future__ import annotations

from typing import Any

from .estimators.base import DECODER_ALGORITHMS, BaseHMM
from .monitor import ConvergenceMonitor

__all__ = ["DECODER_ALGORITHMS", "BaseHMM", "ConvergenceMonitor"]


def __getattr__(name: str) -> Any:
    if name == "VariationalBaseHMM":
        from .variational import VariationalBaseHMM

        return VariationalBaseHMM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
