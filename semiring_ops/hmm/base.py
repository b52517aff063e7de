"""hmmlearn.base's public names, where hmmlearn's users import them from (``from hmmlearn.base import ...``)."""

from .estimators.base import DECODER_ALGORITHMS, BaseHMM
from .monitor import ConvergenceMonitor

__all__ = ["DECODER_ALGORITHMS", "BaseHMM", "ConvergenceMonitor"]
