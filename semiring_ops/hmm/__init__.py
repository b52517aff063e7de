"""Hidden Markov models: the torch model and hmmlearn's classes, drop-in (change one import line).

    from semiring_ops import hmm            # was: from hmmlearn import hmm

    model = hmm.GaussianHMM(n_components=3, covariance_type="full", n_iter=100, random_state=0)
    model.fit(X, lengths)
    log_prob, states = model.decode(X, lengths)

Same constructors, attributes (``startprob_``, ``transmat_``, ``emissionprob_``, ``means_``, ``covars_`` /
``_covars_``, ``n_features``, ``monitor_``, priors, ``params`` / ``init_params`` letters, ``random_state``, ...),
calls and return types (numpy arrays, Python floats) as hmmlearn 0.3; the forward-backward, Viterbi and EM run
on :class:`HMM` in float64. docs/hmm.md lists what differs.

The package:
    model.py        HMM: start, transitions and an emission model; hmmlearn's calls and torch's batches
    emissions/      the Emission interface and one file per family (categorical, gaussian, gmm, poisson, multinomial)
    estimators/     hmmlearn's classes: the shared base and one file per family
    scaling.py      the scaled (probability-space) E-step;  monitor.py  ConvergenceMonitor, progress
    kmeans.py       k-means for the Gaussian means' initialisation;  distributed.py  fit over process groups
"""

from .emissions import COVARIANCE_TYPES, GMMEmission, MultinomialEmission, PoissonEmission
from .estimators import (
    DECODER_ALGORITHMS,
    GMMHMM,
    CategoricalHMM,
    GaussianHMM,
    MultinomialHMM,
    NotFittedError,
    PoissonHMM,
)
from .model import HMM
from .monitor import ConvergenceMonitor

__all__ = [
    "COVARIANCE_TYPES",
    "DECODER_ALGORITHMS",
    "GMMHMM",
    "HMM",
    "CategoricalHMM",
    "ConvergenceMonitor",
    "GMMEmission",
    "GaussianHMM",
    "MultinomialEmission",
    "MultinomialHMM",
    "NotFittedError",
    "PoissonEmission",
    "PoissonHMM",
]
