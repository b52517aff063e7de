"""hmmlearn's estimator classes over :class:`~semiring_ops.hmm.model.HMM`: the shared base and one file per
emission family."""

from .base import DECODER_ALGORITHMS, BaseHMM, NotFittedError, check_random_state
from .categorical import CategoricalHMM
from .gaussian import GaussianHMM

__all__ = [
    "DECODER_ALGORITHMS",
    "BaseHMM",
    "CategoricalHMM",
    "GaussianHMM",
    "NotFittedError",
    "check_random_state",
]
