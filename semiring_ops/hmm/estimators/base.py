"""hmmlearn's estimator interface over :class:`HMM` (the shared base of ``semiring_ops.hmm``'s classes, and of
users' own, written against hmmlearn's hooks).

hmmlearn keeps a model's parameters as plain numpy attributes (``startprob_``, ``transmat_``, the
emission's), settable at any time and validated by ``_check()`` before use; its EM settings
(``n_iter``, ``tol``, ``params``, ``init_params``, priors, ...) are constructor arguments kept as
attributes (scikit-learn's ``get_params`` / ``set_params``). This base does the same, and every
computation builds a float64 :class:`HMM` from the attributes (``_model``) and runs its forward-backward,
Viterbi and EM; ``fit`` writes the re-estimated parameters back as numpy arrays.

Initialisation follows hmmlearn's ``_init``: start and transitions are drawn from a Dirichlet(1/C) with
the numpy ``random_state`` (so the same seed gives hmmlearn's draws), the emission model's parameters
by the subclass; a parameter whose letter is in ``init_params`` is overwritten (with a logged warning if
it was set), one whose attribute is missing is initialised whatever ``init_params`` says.

Two ways to be a subclass, which coexist:

* ours (categorical.py, gaussian.py, ...): a torch :class:`Emission` (``_emission``, ``_set_emission_parameters``,
  ``_read_back_emission``, ``_init_emission``); every call then runs on HMM with that emission model, EM included.
* hmmlearn's documented hooks: ``_compute_log_likelihood(X)`` (or ``_compute_likelihood``) -> (n_samples, C),
  ``_generate_sample_from_state(state, random_state)``, ``_initialize_sufficient_statistics()``,
  ``_accumulate_sufficient_statistics(stats, X, lattice, posteriors, fwdlattice, bwdlattice)``,
  ``_do_mstep(stats)``, ``_check()``, ``_init(X, lengths)``. A class that overrides the likelihood hooks (or has
  no torch emission) is scored and decoded by HMM on ``log_emissions=`` from ``_compute_log_likelihood``; one
  that overrides a likelihood or EM hook is fitted by hmmlearn's loop: per iteration ``_estep_begin()``, the
  forward-backward lattices of every sequence in one batched pass (``_log_lattices``), one
  ``_accumulate_sufficient_statistics`` call per sequence with hmmlearn's numpy arguments (the lattices in
  ``implementation``'s convention: log, or scaled probabilities), ``_compute_lower_bound``, ``_do_mstep`` and
  the monitor's report. The base hooks do what hmmlearn's do (start and transition statistics and their
  Dirichlet M-step); for our families they also re-estimate the emission model, so a subclass of
  GaussianHMM that overrides ``_do_mstep`` and calls ``super()._do_mstep(stats)`` keeps the full EM.

``sample`` is hmmlearn's: a numpy ``random_state`` draws the first state, then, step by step, the observation
(``_generate_sample_from_state``) and the next state, so the same seed gives hmmlearn's sequences.
"""

from __future__ import annotations

import inspect
import logging
import numbers
import string
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..emissions.base import ArrayLike, Emission, dirichlet_map
from ..model import HMM, _Layout
from ..monitor import ConvergenceMonitor

__all__ = ["DECODER_ALGORITHMS", "BaseHMM", "NotFittedError", "check_random_state"]

_log = logging.getLogger("semiring_ops.hmm")

#: hmmlearn's decoder algorithms
DECODER_ALGORITHMS = frozenset(("viterbi", "map"))
IMPLEMENTATIONS = ("log", "scaling")
# hmmlearn's hooks: a subclass overriding one of these is computed through them (see the module docstring)
_LIKELIHOOD_HOOKS = ("_compute_log_likelihood", "_compute_likelihood")
_EM_HOOKS = (
    "_initialize_sufficient_statistics",
    "_accumulate_sufficient_statistics",
    "_do_mstep",
    "_estep_begin",
    "_compute_lower_bound",
)


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


def _log_lattices(
    log_emissions: Tensor, log_trans: Tensor, log_start: Tensor, lengths: Tensor
) -> tuple[Tensor, Tensor]:
    """hmmlearn's log forward and backward lattices of padded log-emissions (B, T, C) -> (fwd, bwd), each (B, T, C):
    fwd[b, t, j] = log p(x_0..x_t, z_t = j), bwd[b, t, i] = log p(x_t+1..x_L-1 | z_t = i), 0 at each sequence's
    last step; entries past a sequence's length are meaningless. (The chain kernels behind HMM never materialise
    the lattices; hmmlearn's ``_accumulate_sufficient_statistics`` takes them.)"""
    fwd, bwd = torch.empty_like(log_emissions), torch.zeros_like(log_emissions)
    T = log_emissions.shape[1]
    if T == 0:
        return fwd, bwd
    fwd[:, 0] = log_start + log_emissions[:, 0]
    for t in range(1, T):
        fwd[:, t] = torch.logsumexp(fwd[:, t - 1, :, None] + log_trans, 1) + log_emissions[:, t]
    for t in range(T - 2, -1, -1):
        step = torch.logsumexp(log_trans + (log_emissions[:, t + 1] + bwd[:, t + 1])[:, None, :], 2)
        bwd[:, t] = torch.where((t + 1 < lengths)[:, None], step, 0.0)
    return fwd, bwd


class BaseHMM:
    """hmmlearn's ``BaseHMM``: start and transition probabilities, EM, scoring, decoding and sampling, over an
    emission model given by a subclass (ours: a torch :class:`Emission`; a user's: hmmlearn's hooks, see the
    module docstring). Without any, ``sample`` draws state sequences with zero features, as hmmlearn's.

    Arrays come back as numpy (float64 probabilities, int64 states), scores as Python floats, as hmmlearn's.
    """

    _emission_letters = ""  # hmmlearn's letters of the emission parameters (ours)

    def __init__(
        self,
        n_components: int = 1,
        startprob_prior: ArrayLike | float = 1.0,
        transmat_prior: ArrayLike | float = 1.0,
        algorithm: str = "viterbi",
        random_state: int | np.random.RandomState | None = None,
        n_iter: int = 10,
        tol: float = 1e-2,
        verbose: bool = False,
        params: str = string.ascii_letters,
        init_params: str = string.ascii_letters,
        implementation: str = "log",
    ) -> None:
        if not isinstance(n_components, numbers.Integral) or n_components <= 0:
            raise ValueError(f"n_components must be a positive int, got {n_components!r}")
        if algorithm not in DECODER_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(DECODER_ALGORITHMS)}, got {algorithm!r}")
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

    # ------------------------------------------------------------ which path: our emission model or the hooks

    def _overrides(self, *names: str) -> bool:
        """Whether this class overrides one of BaseHMM's methods `names`."""
        return any(getattr(type(self), name) is not getattr(BaseHMM, name) for name in names)

    def _scored_by_hooks(self) -> bool:
        """Emission log-likelihoods come from ``_compute_log_likelihood`` (not from a torch emission model)."""
        return self._overrides(*_LIKELIHOOD_HOOKS) or not self._overrides("_emission")

    def _fitted_by_hooks(self) -> bool:
        """fit runs hmmlearn's loop over the hooks (not HMM.fit)."""
        return self._scored_by_hooks() or self._overrides(*_EM_HOOKS)

    def _emission_updates(self) -> str:
        """The letters of ``params`` that our torch emission model re-estimates ("" for hook-scored classes)."""
        return "" if self._scored_by_hooks() else "".join(c for c in self._emission_letters if c in self.params)

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
        """Validate the parameters (shapes, sums) before use, as hmmlearn's ``_check`` (numpy arrays after)."""
        C = self.n_components
        for name, shape, what in (
            ("startprob_", (C,), "n_components,"),
            ("transmat_", (C, C), "n_components, n_components"),
        ):
            self._require(name)
            self._check_array(name, shape, what)
            self._check_sum_1(name)

    def _check_X(self, X: ArrayLike) -> np.ndarray:
        """hmmlearn's ``check_array``: X (n_samples, n_features), at least one sample, finite numbers."""
        X = np.asarray(X)
        if X.ndim != 2 or len(X) == 0:
            raise ValueError(f"X has shape {X.shape}; expected (n_samples, n_features), at least one sample")
        if np.issubdtype(X.dtype, np.number) and not np.isfinite(X).all():
            raise ValueError(f"X (shape {X.shape}) has non-finite values")
        return X

    def _samples(self, X: ArrayLike, what: str = "") -> np.ndarray:
        """X as an array (n_samples, n_features), at least one sample, n_features columns once that is set; else a
        ValueError naming X's shape and what this class expects (`what`: e.g. "counts ")."""
        X = np.asarray(X)
        D = getattr(self, "n_features", None)
        expected = f"(n_samples, {D})" if D is not None else "(n_samples, n_features)"
        if X.ndim != 2 or len(X) == 0 or (D is not None and X.shape[1] != D):
            name = type(self).__name__
            raise ValueError(f"X has shape {X.shape}; {name} expects {what}{expected}, at least one sample")
        return X

    def _real_samples(self, X: ArrayLike) -> np.ndarray:
        """_samples of finite real numbers, as float64 (the Gaussian families' X)."""
        X = self._samples(X)
        if not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)):
            raise ValueError(f"X must hold real numbers, got dtype {X.dtype} (shape {X.shape})")
        if not np.isfinite(X).all():
            raise ValueError(f"X (shape {X.shape}) has non-finite values")
        return X.astype(np.float64, copy=False)

    def _check_and_set_n_features(self, X: np.ndarray) -> None:
        """n_features from X's columns, or X checked against it."""
        n_features = X.shape[1]
        if getattr(self, "n_features", None) is None:
            self.n_features = n_features
        elif self.n_features != n_features:
            raise ValueError(f"X has shape {X.shape}; this {type(self).__name__} has n_features={self.n_features}")

    def _get_n_fit_scalars_per_param(self) -> dict[str, int] | None:
        """The number of free scalars of each parameter letter (for aic, bic and the degenerate-fit warning)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _get_n_fit_scalars_per_param")

    @staticmethod
    def _lengths(lengths: ArrayLike | int | None) -> ArrayLike | None:
        return None if lengths is None else np.atleast_1d(np.asarray(lengths))

    @staticmethod
    def _bounds(n_samples: int, lengths: ArrayLike | None) -> list[slice]:
        """The slice of each sequence of X (n_samples, ...) (lengths None: one sequence)."""
        if lengths is None:
            return [slice(0, n_samples)]
        stops = np.cumsum(lengths)
        if len(stops) == 0 or stops[-1] != n_samples:
            raise ValueError(f"lengths sum to {int(stops[-1]) if len(stops) else 0} but X has n_samples={n_samples}")
        return [slice(int(stop - length), int(stop)) for stop, length in zip(stops, lengths, strict=True)]

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

    def _init(self, X: ArrayLike, lengths: ArrayLike | None = None) -> None:
        """hmmlearn's initialisation before EM (module docstring); X (n_samples, ...), lengths (n_sequences,)."""
        X = self._check_X(X)
        self._check_and_set_n_features(X)
        C = self.n_components
        random_state = check_random_state(self.random_state)
        if self._needs_init("s", "startprob_"):
            self.startprob_ = random_state.dirichlet(np.full(C, 1.0 / C))
        if self._needs_init("t", "transmat_"):
            self.transmat_ = random_state.dirichlet(np.full(C, 1.0 / C), size=C)
        self._warn_if_degenerate(X)
        self._init_emission(X)

    def _warn_if_degenerate(self, X: np.ndarray) -> None:
        """hmmlearn's warning when the parameters being fitted outnumber the data's scalars."""
        per_param = self._get_n_fit_scalars_per_param()
        n_fit = sum(per_param.get(p, 0) for p in self.params) if per_param is not None else 0
        if X.size < n_fit:
            _log.warning(
                "Fitting %d free scalar parameters to only %d data points will result in a degenerate solution.",
                n_fit,
                X.size,
            )

    def _init_emission(self, X: np.ndarray) -> None:
        """Our families' emission initialisation (a hook-based subclass overrides ``_init`` instead)."""

    # ------------------------------------------------------------ the torch model

    def _emission(self) -> Emission:
        """A new emission model of this estimator's kind and settings (parameters set later)."""
        raise NotImplementedError

    def _set_emission_parameters(self, model: HMM) -> None:
        raise NotImplementedError

    def _read_back_emission(self, model: HMM, letters: str) -> None:
        raise NotImplementedError

    def _model(self) -> HMM:
        """A float64 HMM holding this estimator's (validated) parameters and EM priors; with no emission model
        when scored by the hooks (it then takes ``log_emissions=``)."""
        self._check()
        emission = None if self._scored_by_hooks() else self._emission()
        model = HMM(
            self.n_components,
            emission,
            startprob_prior=self.startprob_prior,
            transmat_prior=self.transmat_prior,
            generator=torch.Generator(),  # its random parameters are overwritten next
        ).double()
        model.startprob_, model.transmat_ = self.startprob_, self.transmat_
        if emission is not None:
            self._set_emission_parameters(model)
        return model

    @staticmethod
    def _numpy(t: Tensor) -> np.ndarray:
        return t.detach().cpu().numpy().copy()

    @staticmethod
    def _log(p: ArrayLike) -> Tensor:
        """log of probabilities (numpy or a list) as a float64 tensor (log 0 = -inf)."""
        with np.errstate(divide="ignore"):
            return torch.from_numpy(np.log(np.asarray(p, dtype=np.float64)))

    def _inputs(self, X: ArrayLike, lengths: ArrayLike | int | None) -> tuple[HMM, dict[str, Any]]:
        """The fitted model and the keyword arguments of its hmmlearn-style calls on X: the observations, or
        the log-emissions from ``_compute_log_likelihood`` when scored by the hooks."""
        self._require("startprob_")
        model = self._model()
        X, lengths = self._check_X(X), self._lengths(lengths)
        if model.emission is None:
            return model, {"X": None, "lengths": lengths, "log_emissions": self._log_frameprob(X, lengths)}
        return model, {"X": X, "lengths": lengths}

    # ------------------------------------------------------------ hmmlearn's hooks (defaults)

    def _compute_log_likelihood(self, X: np.ndarray) -> np.ndarray:
        """log p(x_t | state) of one sequence X (n_samples, ...) -> (n_samples, n_components): from
        ``_compute_likelihood`` when a subclass overrides that, else from our torch emission model."""
        if self._overrides("_compute_likelihood"):
            with np.errstate(divide="ignore"):
                return np.log(self._compute_likelihood(X))
        if not self._overrides("_emission"):
            raise NotImplementedError(f"{type(self).__name__} must implement _compute_log_likelihood")
        emission = self._model().emission
        return self._numpy(emission.log_prob(emission.check(self._check_X(X), 1)))

    def _compute_likelihood(self, X: np.ndarray) -> np.ndarray:
        """p(x_t | state) of one sequence X (n_samples, ...) -> (n_samples, n_components)."""
        with np.errstate(under="ignore"):
            return np.exp(self._compute_log_likelihood(X))

    def _log_frameprob(self, X: np.ndarray, lengths: ArrayLike | None) -> np.ndarray:
        """``_compute_log_likelihood`` of each sequence (as hmmlearn calls it), concatenated: (n_samples, C)."""
        bounds = self._bounds(len(X), lengths)
        frameprob = np.concatenate([np.asarray(self._compute_log_likelihood(X[s]), dtype=np.float64) for s in bounds])
        if frameprob.shape != (len(X), self.n_components):
            raise ValueError(
                f"_compute_log_likelihood gave shape {frameprob.shape} for X of shape {X.shape}; "
                f"expected (n_samples, n_components={self.n_components})"
            )
        return frameprob

    def _generate_sample_from_state(self, state: int, random_state: np.random.RandomState) -> ArrayLike:
        """One observation (n_features,) from state `state`, drawn with the numpy `random_state`; the base has
        no emission model: an empty observation, as hmmlearn's."""
        return ()

    def _initialize_sufficient_statistics(self) -> dict[str, Any]:
        """hmmlearn's fresh statistics: nobs (sequences seen), start (C,) and trans (C, C) expected counts."""
        C = self.n_components
        return {"nobs": 0, "start": np.zeros(C), "trans": np.zeros((C, C))}

    def _accumulate_sufficient_statistics(
        self,
        stats: dict[str, Any],
        X: np.ndarray,
        lattice: np.ndarray,
        posteriors: np.ndarray,
        fwdlattice: np.ndarray,
        bwdlattice: np.ndarray,
    ) -> None:
        """Add one sequence X (n_samples, ...) to `stats`: lattice (n_samples, C) its log-emissions (``implementation``
        "log") or emission probabilities ("scaling"), posteriors (n_samples, C), fwdlattice and bwdlattice
        (n_samples, C) the forward and backward lattices in the same convention as hmmlearn's."""
        stats["nobs"] += 1
        if "s" in self.params:
            stats["start"] += posteriors[0]
        if "t" in self.params and len(lattice) > 1:
            stats["trans"] += self._transition_counts(lattice, fwdlattice, bwdlattice)
        if self._emission_updates():
            stats.setdefault("emission", []).append((X, posteriors))

    def _transition_counts(self, lattice: np.ndarray, fwdlattice: np.ndarray, bwdlattice: np.ndarray) -> np.ndarray:
        """Expected transition counts (C, C) of one sequence from its lattices (hmmlearn's xi summed over time)."""
        if self.implementation == "scaling":
            return self.transmat_ * (fwdlattice[:-1].T @ (lattice[1:] * bwdlattice[1:]))
        with np.errstate(divide="ignore"):
            log_trans = np.log(self.transmat_)
        log_prob = np.logaddexp.reduce(fwdlattice[-1])
        log_xi = fwdlattice[:-1, :, None] + log_trans + (lattice[1:] + bwdlattice[1:])[:, None, :] - log_prob
        with np.errstate(under="ignore"):
            return np.exp(log_xi).sum(0)

    def _do_mstep(self, stats: dict[str, Any]) -> None:
        """hmmlearn's M-step from `stats`: start and transitions under their Dirichlet priors (zeros stay zero;
        a row with no counts keeps its values, as HMM.fit), and our emission model's parameters."""
        pairs = stats.get("emission")
        if pairs:
            letters, model = self._emission_updates(), self._model()
            x = model.emission.check(np.concatenate([p[0] for p in pairs]), 1)
            model.emission.m_step(x, torch.from_numpy(np.concatenate([p[1] for p in pairs])), letters)
            self._read_back_emission(model, letters)
        for letter, key, name, prior in (
            ("s", "start", "startprob_", "startprob_prior"),
            ("t", "trans", "transmat_", "transmat_prior"),
        ):
            if letter in self.params:
                counts = torch.as_tensor(stats[key], dtype=torch.float64)
                log_p = dirichlet_map(counts, getattr(self, prior), self._log(getattr(self, name)), prior, True)
                setattr(self, name, log_p.exp().numpy())

    def _estep_begin(self) -> None:
        """Called at the start of each E-step of the hook-based fit (hmmlearn's; nothing here)."""

    def _compute_lower_bound(self, curr_logprob: float) -> float:
        """What the monitor records of an E-step's log-likelihood: itself (hmmlearn's EM)."""
        return curr_logprob

    def _do_estep(self, X: np.ndarray, lengths: ArrayLike) -> tuple[dict[str, Any], float]:
        """One E-step through the hooks: the lattices of all sequences in one batched pass, then one
        ``_accumulate_sufficient_statistics`` call per sequence -> (stats, total log-likelihood)."""
        stats = self._initialize_sufficient_statistics()
        self._estep_begin()
        lengths = np.asarray(lengths, dtype=np.int64)
        log_frameprob = torch.from_numpy(self._log_frameprob(X, lengths))
        layout = _Layout.of(torch.from_numpy(lengths))
        log_start, log_trans = self._log(self.startprob_), self._log(self.transmat_)
        fwd, bwd = _log_lattices(layout.pad(log_frameprob), log_trans, log_start, layout.lengths)
        totals = torch.logsumexp(fwd, -1)  # (B, T): log p(x_0..x_t)
        log_probs = totals.gather(1, (layout.lengths - 1).clamp_min(0)[:, None])[:, 0]
        log_probs = torch.where(layout.lengths > 0, log_probs, 0.0)
        log_prob = float(log_probs.sum())
        if not np.isfinite(log_prob):
            bad = torch.nonzero(~torch.isfinite(log_probs)).flatten().tolist()
            raise ValueError(f"X has zero probability under the model (sequences {bad[:10]})")
        posteriors = torch.softmax(fwd + bwd, -1)
        lattice = log_frameprob
        if self.implementation == "scaling":  # hmmlearn's scaled lattices: fwd normalised per step
            before = torch.nn.functional.pad(totals[:, :-1], (1, 0))
            fwd, bwd = (fwd - totals[..., None]).exp(), (bwd - log_probs[:, None, None] + before[..., None]).exp()
            lattice = log_frameprob.exp()
        fwd, bwd, posteriors = (self._numpy(layout.unpad(t)) for t in (fwd, bwd, posteriors))
        lattice = self._numpy(lattice)
        for s in self._bounds(len(X), lengths):
            if s.stop > s.start:
                self._accumulate_sufficient_statistics(stats, X[s], lattice[s], posteriors[s], fwd[s], bwd[s])
        return stats, log_prob

    # ------------------------------------------------------------ hmmlearn's calls

    def fit(self, X: ArrayLike, lengths: ArrayLike | int | None = None, *, group: Any = None) -> BaseHMM:
        """Initialise (``_init``, ``init_params``) and run up to ``n_iter`` Baum-Welch EM iterations on the
        concatenated sequences X (lengths: their lengths, None: one sequence), re-estimating ``params``;
        ``monitor_`` records the log-likelihoods and stops EM at ``monitor_.tol``. Returns self.

        ``group`` (not in hmmlearn): a torch.distributed process group whose ranks each pass their shard of
        the sequences (HMM.fit(group=)): every rank ends with the model of a one-process fit on the union.
        The starting parameters are rank 0's: initialised from rank 0's shard when ``init_params`` asks.
        Not for classes fitted through hmmlearn's hooks."""
        X = self._check_X(X)
        lengths = np.array([len(X)]) if lengths is None else self._lengths(lengths)
        self._init(X, lengths)
        self._check()
        self.monitor_._reset()
        if self._fitted_by_hooks():
            if group is not None:
                raise NotImplementedError(f"{type(self).__name__} is fitted through hmmlearn's hooks: no group fit")
            return self._fit_by_hooks(X, lengths)
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

    def _fit_by_hooks(self, X: np.ndarray, lengths: np.ndarray) -> BaseHMM:
        """hmmlearn's EM loop over the hooks (see the module docstring)."""
        for _ in range(self.n_iter):
            stats, log_prob = self._do_estep(X, lengths)
            lower_bound = self._compute_lower_bound(log_prob)
            self._do_mstep(stats)  # before the convergence test: n_iter=1 still updates
            self.monitor_.report(lower_bound)
            if self.monitor_.converged:
                break
            if (np.asarray(self.transmat_).sum(axis=1) == 0).any():
                _log.warning("some rows of transmat_ sum to 0: no transition from those states was seen")
        return self

    def _score(
        self, X: ArrayLike, lengths: ArrayLike | int | None = None, *, compute_posteriors: bool
    ) -> tuple[float, np.ndarray]:
        """hmmlearn's helper of score and score_samples: (log-likelihood, posteriors (n_samples, C), or an empty
        (0, C) array without ``compute_posteriors``)."""
        model, inputs = self._inputs(X, lengths)
        if not compute_posteriors:
            return float(model.score(**inputs)), np.empty((0, self.n_components))
        log_prob, posteriors = model.score_samples(**inputs)
        return float(log_prob), self._numpy(posteriors)

    def score(self, X: ArrayLike, lengths: ArrayLike | int | None = None) -> float:
        """Log-likelihood of the concatenated sequences X."""
        return self._score(X, lengths, compute_posteriors=False)[0]

    def score_samples(self, X: ArrayLike, lengths: ArrayLike | int | None = None) -> tuple[float, np.ndarray]:
        """(log-likelihood, state posteriors (n_samples, n_components))."""
        return self._score(X, lengths, compute_posteriors=True)

    def decode(
        self, X: ArrayLike, lengths: ArrayLike | int | None = None, algorithm: str | None = None
    ) -> tuple[float, np.ndarray]:
        """(log-probability, states (n_samples,)): "viterbi" the most likely paths and their joint
        log-probability; "map" the most likely state at each sample and the sum of those posteriors'
        maxima (hmmlearn's value); None: ``self.algorithm``."""
        algorithm = algorithm or self.algorithm
        if algorithm not in DECODER_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(DECODER_ALGORITHMS)}, got {algorithm!r}")
        model, inputs = self._inputs(X, lengths)
        log_prob, states = model.decode(algorithm=algorithm, **inputs)
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
        """One sequence of n_samples steps -> (X (n_samples, n_features), states (n_samples,)), as hmmlearn draws
        it: random_state (None: ``self.random_state``; see check_random_state) draws the first state (unless
        ``currstate`` gives it), then for each step the observation (``_generate_sample_from_state``) and the
        next state by inverse CDF of one uniform, so a seed gives hmmlearn's sequences. (hmmlearn's quirk kept:
        n_samples < 1 still draws one step.)"""
        self._require("startprob_")
        self._check()
        random_state = check_random_state(self.random_state if random_state is None else random_state)
        transmat_cdf = np.cumsum(self.transmat_, axis=1)
        if currstate is None:
            state = int(np.argmax(np.cumsum(self.startprob_) > random_state.rand()))
        elif 0 <= int(currstate) < self.n_components:
            state = int(currstate)
        else:
            raise ValueError(f"currstate must lie in 0..{self.n_components - 1}, got {currstate}")
        states, X = [state], [self._generate_sample_from_state(state, random_state)]
        for _ in range(int(n_samples) - 1):
            state = int(np.argmax(transmat_cdf[state] > random_state.rand()))
            states.append(state)
            X.append(self._generate_sample_from_state(state, random_state))
        return np.atleast_2d(X), np.array(states, dtype=int)

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
