"""hmmlearn.utils' helpers on numpy arrays: ``normalize``, ``log_normalize`` (both in place) and ``fill_covars``."""

from __future__ import annotations

import numpy as np

__all__ = ["fill_covars", "log_normalize", "normalize"]


def normalize(a: np.ndarray, axis: int | None = None) -> None:
    """Scale ``a`` in place so that it sums to 1 (along ``axis``; None: over all of it).

    As hmmlearn's: along a nonzero axis of a multi-dimensional array, slices that sum to 0 are left at 0
    instead of becoming NaN; along axis 0 or over the whole array, a zero sum divides by zero as numpy does.
    """
    total = a.sum(axis)
    if axis and a.ndim > 1:
        total[total == 0] = 1
        total = np.expand_dims(total, axis)
    a /= total


def log_normalize(a: np.ndarray, axis: int | None = None) -> None:
    """Shift log-values ``a`` in place so that ``exp(a)`` sums to 1 (along ``axis``; None: over all of it).

    A single entry along ``axis`` becomes 0 (log 1), even when it is -inf (a one-component mixture)."""
    if axis is not None and a.shape[axis] == 1:
        a[...] = 0
        return
    top = np.max(a, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    with np.errstate(under="ignore", divide="ignore"):
        a -= np.log(np.sum(np.exp(a - top), axis=axis, keepdims=True)) + top


def fill_covars(
    covars: np.ndarray, covariance_type: str = "full", n_components: int = 1, n_features: int = 1
) -> np.ndarray:
    """Covariances in ``covariance_type``'s compact form -> full matrices (n_components, n_features, n_features):
    full (C, D, D) as given, diag (C, D), tied (D, D), spherical (C,) (or any shape holding C values)."""
    if covariance_type == "full":
        return covars
    if covariance_type == "diag":
        return np.stack([np.diag(row) for row in np.asarray(covars)])
    if covariance_type == "tied":
        return np.tile(covars, (n_components, 1, 1))
    if covariance_type == "spherical":
        return np.ravel(covars)[:, None, None] * np.eye(n_features)[None]
    raise ValueError(f"covariance_type must be 'spherical', 'diag', 'full' or 'tied', got {covariance_type!r}")
