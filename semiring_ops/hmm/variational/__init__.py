"""Variational Bayes HMMs (hmmlearn's ``vhmm``): Dirichlet / Normal-Wishart priors and posteriors over the
parameters, fitted by variational EM on :class:`~semiring_ops.hmm.model.HMM`'s forward-backward.

    base.py         VariationalBaseHMM: the variational EM loop, start and transitions, the ELBO
    estep.py        forward-backward under sub-normalised parameters
    kl.py           expectations and KL divergences of the Dirichlet, Normal and Wishart
    categorical.py  VariationalCategoricalHMM;  gaussian.py  VariationalGaussianHMM
"""

from .base import VariationalBaseHMM
from .categorical import VariationalCategoricalHMM
from .gaussian import VariationalGaussianHMM

__all__ = ["VariationalBaseHMM", "VariationalCategoricalHMM", "VariationalGaussianHMM"]
