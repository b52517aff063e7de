"""hmmlearn's ``vhmm`` module: the variational Bayes HMMs, drop-in (``from semiring_ops import vhmm``).

    model = vhmm.VariationalGaussianHMM(n_components=4, covariance_type="full", n_iter=100, random_state=0)
    model.fit(X, lengths)        # monitor_.history: the evidence lower bound of each iteration

See semiring_ops/hmm/variational/ and docs/hmm.md.
"""

from .hmm.variational import VariationalCategoricalHMM, VariationalGaussianHMM

__all__ = ["VariationalCategoricalHMM", "VariationalGaussianHMM"]
