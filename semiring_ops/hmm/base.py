"""hmmlearn.base's public names, where hmmlearn's users import them from (``from hmmlearn.base import ...``)."""

from .estimators.base import DECODER_ALGORITHMS, HMMLearnBase
from .monitor import ConvergenceMonitor

BaseHMM = HMMLearnBase

__all__ = ["DECODER_ALGORITHMS", "BaseHMM", "ConvergenceMonitor"]
