"""hmmlearn's estimator interface over :class:`HMM` (the shared base of ``semiring_ops.hmm``'s classes).

hmmlearn keeps a model's parameters as plain numpy attributes (``startprob_``, ``transmat_``, the
emission's), settable at any time and validated by ``_check()`` before use; its EM settings
(``n_iter``, ``tol``, ``params``, ``init_params``, priors, ...) are constructor arguments kept as
attributes (scikit-learn's ``get_params`` / ``set_params``). This base does the same, and every
computation builds a float64 :class:`HMM` from the attributes (``_model``) and runs its forward-backward,
Viterbi, EM and sampling; ``fit`` writes the re-estimated parameters back as numpy arrays.

Initialisation follows hmmlearn's ``_init``: start and transitions are drawn from a Dirichlet(1/C) with
the numpy ``random_state`` (so the same seed gives hmmlearn's draws), the emission model's parameters
by the subclass; a parameter whose letter is in ``init_params`` is overwritten (with a logged warning if
it was set), one whose attribute is missing is initialised whatever ``init_params`` says.
"""

from __future__ import annotations

import inspect
import logging
import numbers
from typing import Any

import numpy as np
import torch

from ..emissions.base import ArrayLike, Emission
from ..model import HMM
from ..monitor import ConvergenceMonitor

__all__ = ["BaseHMM", "NotFittedError", "check_random_state"]

_log = logging.getLogger("semiring_ops.hmm")

DECODER_ALGORITHMS = ("viterbi", "map")
IMPLEMENTATIONS = ("log", "scaling")


class NotFittedError(ValueError, AttributeError):
    """A model was used before its parameters were set (by ``fit`` or by hand)."""


def check_random_state(seed: int | np.random.RandomState | None) -> np.random.RandomState:
    """hmmlearn's (scikit-learn's) random_state rule: None -> numpy's global RandomState (the one behind
    ``np.random.seed``), an int -> a new RandomState(seed), a RandomState -> itself."""
    if seed is None:
        return np.random.mtrand._rand
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return np.random.RandomState(int(seed))
    if isinstance(seed, np.random.RandomState):
        return seed
    raise ValueError(f"random_state must be None, an int or a numpy RandomState, got {seed!r}")


def torch_generator(random_state: np.random.RandomState) -> torch.Generator:
    """A CPU torch.Generator seeded by one draw from a numpy RandomState."""
    return torch.Generator().manual_seed(int(random_state.randint(0, 2**62, dtype=np.int64)))


class BaseHMM:
    """The part of hmmlearn's ``BaseHMM`` that every emission type shares; subclasses provide the emission
    model (``_emission``, ``_set_emission_parameters``, ``_read_back_emission``), ``_check_X``,
    ``_check_and_set_n_features``, ``_init_emission`` and ``_get_n_fit_scalars_per_param``.

    Arrays come back as numpy (float64 probabilities, int64 states), scores as Python floats, as hmmlearn's.
    """

    _emission_letters = ""  # hmmlearn's letters of the emission parameters

    def __init__(
        self,
        n_components: int,
        startprob_prior: ArrayLike | float,
        transmat_prior: ArrayLike | float,
        algorithm: str,
        random_state: int | np.random.RandomState | None,
        n_iter: int,
        tol: float,
        verbose: bool,
        params: str,
        init_params: str,
        implementation: str,
    ) -> None:
        if not isinstance(n_components, numbers.Integral) or n_components <= 0:
            raise ValueError(f"n_components must be a positive int, got {n_components!r}")
        if algorithm not in DECODER_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {DECODER_ALGORITHMS}, got {algorithm!r}")
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
        self.n_components = n_components
        self.startprob_prior, self.transmat_prior = startprob_prior, transmat_prior
        self.algorithm, self.random_state = algorithm, random_state
        self.n_iter, self.tol, self.verbose = n_iter, tol, verbose
        self.params, self.init_params, self.implementation = params, init_params, implementation
        self.monitor_ = ConvergenceMonitor(tol, n_iter, verbose)

    # ------------------------------------------------------------ scikit-learn's estimator protocol

    @classmethod
    def _get_param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return sorted(p.name for p in sig.parameters.values() if p.name != "self" and p.kind != p.VAR_KEYWORD)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor arguments as currently set (scikit-learn's protocol)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params: Any) -> BaseHMM:
        """Set constructor arguments by name (scikit-learn's protocol)."""
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}; valid: {valid}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        shown = []
        for name, value in self.get_params().items():
            default = defaults.get(name, inspect.Parameter.empty)
            if isinstance(value, np.ndarray) or isinstance(default, np.ndarray) or value != default:
                shown.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    # ------------------------------------------------------------ validation

    def _require(self, *names: str) -> None:
        for name in names:
            if not hasattr(self, name):
                raise NotFittedError(
                    f"this {type(self).__name__} has no {name}: call fit, or set the parameters, first"
                )

    def _check_sum_1(self, name: str) -> None:
        sums = getattr(self, name).sum(axis=-1)
        if not np.allclose(sums, 1):
            raise ValueError(f"{name} must sum to 1 along its last axis, got sums {np.round(sums, 6).tolist()}")

    def _check_array(self, name: str, shape: tuple[int, ...], what: str) -> None:
        value = np.asarray(getattr(self, name))
        if value.shape != shape:
            raise ValueError(f"{name} has shape {value.shape}; expected {shape} ({what})")
        setattr(self, name, value)

    def _check(self) -> None:
        """Validate the parameters (shapes, sums) before use, as hmmlearn's ``_check``."""
        self._require("startprob_", "transmat_")
        C = self.n_components
        self._check_array("startprob_", (C,), "n_components,")
        self._check_sum_1("startprob_")
        self._check_array("transmat_", (C, C), "n_components, n_components")
        self._check_sum_1("transmat_")

    def _check_X(self, X: ArrayLike) -> np.ndarray:
        raise NotImplementedError

    def _check_and_set_n_features(self, X: np.ndarray) -> None:
        raise NotImplementedError

    def _get_n_fit_scalars_per_param(self) -> dict[str, int]:
        raise NotImplementedError

    @staticmethod
    def _lengths(lengths: ArrayLike | int | None) -> ArrayLike | None:
        return None if lengths is None else np.atleast_1d(np.asarray(lengths))

    # ------------------------------------------------------------ initialisation

    def _needs_init(self, code: str, name: str) -> bool:
        """Whether parameter `name` (letter `code`) must be initialised; warns when a set one is overwritten."""
        if code in self.init_params:
            if hasattr(self, name):
                _log.warning(
                    "%s is set, but it will be overwritten during initialization because init_params contains %r",
                    name,
                    code,
                )
            return True
        return not hasattr(self, name)

    def _init(self, X: ArrayLike, lengths: ArrayLike | int | None = None) -> None:
        """hmmlearn's initialisation before EM (see the module docstring)."""
        X = self._check_X(X)
        self._check_and_set_n_features(X)
        C = self.n_components
        random_state = check_random_state(self.random_state)
        if self._needs_init("s", "startprob_"):
            self.startprob_ = random_state.dirichlet(np.full(C, 1.0 / C))
        if self._needs_init("t", "transmat_"):
            self.transmat_ = random_state.dirichlet(np.full(C, 1.0 / C), size=C)
        per_param = self._get_n_fit_scalars_per_param()
        n_fit = sum(per_param.get(p, 0) for p in self.params)
        if X.size < n_fit:
            _log.warning(
                "Fitting %d free scalar parameters to only %d data points will result in a degenerate solution.",
                n_fit,
                X.size,
            )
        self._init_emission(X)

    def _init_emission(self, X: np.ndarray) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ the torch model

    def _emission(self) -> Emission:
        """A new emission model of this estimator's kind and settings (parameters set later)."""
        raise NotImplementedError

    def _set_emission_parameters(self, model: HMM) -> None:
        raise NotImplementedError

    def _read_back_emission(self, model: HMM, letters: str) -> None:
        raise NotImplementedError

    def _model(self) -> HMM:
        """A float64 HMM holding this estimator's (validated) parameters and EM priors."""
        self._check()
        model = HMM(
            self.n_components,
            self._emission(),
            startprob_prior=self.startprob_prior,
            transmat_prior=self.transmat_prior,
            generator=torch.Generator(),  # its random parameters are overwritten next
        ).double()
        model.startprob_, model.transmat_ = self.startprob_, self.transmat_
        self._set_emission_parameters(model)
        return model

    @staticmethod
    def _numpy(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().numpy().copy()

    # ------------------------------------------------------------ hmmlearn's calls

    def fit(self, X: ArrayLike, lengths: ArrayLike | int | None = None, *, group: Any = None) -> BaseHMM:
        """Initialise (``init_params``) and run up to ``n_iter`` Baum-Welch EM iterations on the concatenated
        sequences X (lengths: their lengths, None: one sequence), re-estimating ``params``; ``monitor_``
        records the log-likelihoods and stops EM at ``monitor_.tol``. Returns self.

        ``group`` (not in hmmlearn): a torch.distributed process group whose ranks each pass their shard of
        the sequences (HMM.fit(group=)): every rank ends with the model of a one-process fit on the union.
        The starting parameters are rank 0's: initialised from rank 0's shard when ``init_params`` asks."""
        X = self._check_X(X)
        lengths = self._lengths(lengths)
        self._init(X, lengths)
        self._check()
        self.monitor_._reset()
        model = self._model()
        verbose = bool(getattr(self.monitor_, "verbose", self.verbose))
        model.fit(
            X, lengths, n_iter=self.n_iter, verbose=verbose, params=self.params, monitor=self.monitor_, group=group
        )
        if self.monitor_.iter:
            if "s" in self.params:
                self.startprob_ = self._numpy(model.startprob_)
            if "t" in self.params:
                self.transmat_ = self._numpy(model.transmat_)
            self._read_back_emission(model, "".join(c for c in self._emission_letters if c in self.params))
        return self

    def _fitted_model(self) -> HMM:
        self._require("startprob_")
        return self._model()

    def score(self, X: ArrayLike, lengths: ArrayLike | int | None = None) -> float:
        """Log-likelihood of the concatenated sequences X."""
        model = self._fitted_model()
        return float(model.score(self._check_X(X), self._lengths(lengths)))

    def score_samples(self, X: ArrayLike, lengths: ArrayLike | int | None = None) -> tuple[float, np.ndarray]:
        """(log-likelihood, state posteriors (n_samples, n_components))."""
        model = self._fitted_model()
        log_prob, posteriors = model.score_samples(self._check_X(X), self._lengths(lengths))
        return float(log_prob), self._numpy(posteriors)

    def decode(
        self, X: ArrayLike, lengths: ArrayLike | int | None = None, algorithm: str | None = None
    ) -> tuple[float, np.ndarray]:
        """(log-probability, states (n_samples,)): "viterbi" the most likely paths and their joint
        log-probability; "map" the most likely state at each sample and the sum of those posteriors'
        maxima (hmmlearn's value); None: ``self.algorithm``."""
        algorithm = algorithm or self.algorithm
        if algorithm not in DECODER_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {DECODER_ALGORITHMS}, got {algorithm!r}")
        model = self._fitted_model()
        log_prob, states = model.decode(self._check_X(X), self._lengths(lengths), algorithm)
        return float(log_prob), self._numpy(states)

    def predict(self, X: ArrayLike, lengths: ArrayLike | int | None = None) -> np.ndarray:
        """States (n_samples,) by ``self.algorithm``."""
        return self.decode(X, lengths)[1]

    def predict_proba(self, X: ArrayLike, lengths: ArrayLike | int | None = None) -> np.ndarray:
        """State posteriors (n_samples, n_components)."""
        return self.score_samples(X, lengths)[1]

    def sample(
        self,
        n_samples: int = 1,
        random_state: int | np.random.RandomState | None = None,
        currstate: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One sequence of n_samples steps -> (X (n_samples, n_features), states (n_samples,)).

        random_state (None: ``self.random_state``) seeds the torch generator that draws it, so a seed
        gives reproducible samples (not hmmlearn's: it draws with numpy); currstate: the first state.
        """
        model = self._fitted_model()
        if currstate is not None:
            if not 0 <= int(currstate) < self.n_components:
                raise ValueError(f"currstate must lie in 0..{self.n_components - 1}, got {currstate}")
            model.startprob_ = np.eye(self.n_components)[int(currstate)]
        generator = torch_generator(check_random_state(self.random_state if random_state is None else random_state))
        X, states = model.sample(int(n_samples), generator)
        return self._numpy(X), self._numpy(states)

    def _n_free_parameters(self) -> int:
        return sum(self._get_n_fit_scalars_per_param().values())

    def aic(self, X: ArrayLike, lengths: ArrayLike | int | None = None) -> float:
        """Akaike information criterion: -2 log-likelihood + 2 (number of free parameters)."""
        return -2 * self.score(X, lengths) + 2 * self._n_free_parameters()

    def bic(self, X: ArrayLike, lengths: ArrayLike | int | None = None) -> float:
        """Bayesian information criterion: -2 log-likelihood + (number of free parameters) log(n_samples)."""
        return -2 * self.score(X, lengths) + self._n_free_parameters() * np.log(len(self._check_X(X)))

    def get_stationary_distribution(self) -> np.ndarray:
        """The stationary distribution of the transition matrix (its left eigenvector of eigenvalue 1)."""
        self._require("transmat_")
        values, vectors = np.linalg.eig(np.asarray(self.transmat_).T)
        vector = np.real_if_close(vectors[:, np.argmax(values)])
        return vector / vector.sum()
