"""hmmlearn's estimator classes over :class:`~semiring_ops.hmm.model.HMM`: the shared base and one file per
emission family."""

from .base import DECODER_ALGORITHMS, BaseHMM, NotFittedError, check_random_state
from .categorical import CategoricalHMM
from .gaussian import GaussianHMM
from .gmm import GMMHMM
from .multinomial import MultinomialHMM
from .poisson import PoissonHMM

__all__ = [
    "DECODER_ALGORITHMS",
    "GMMHMM",
    "BaseHMM",
    "CategoricalHMM",
    "GaussianHMM",
    "MultinomialHMM",
    "NotFittedError",
    "PoissonHMM",
    "check_random_state",
]
