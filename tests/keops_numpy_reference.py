"""NumPy reference functions that KeOps's test_torch.py imports from ``pykeops.numpy.utils``: tests/test_keops_suite.py
rewrites that import to this module, so KeOps's tests run without importing pykeops. Written here from the
kernels' definitions (the LazyTensor formulas of those tests); only ``log_np_kernel`` and ``log_sum_exp`` serve
the LazyTensor tests, the others complete the imported names."""

from __future__ import annotations

import numpy as np

__all__ = ["differences", "grad_np_kernel", "log_np_kernel", "log_sum_exp", "np_kernel", "squared_distances"]


def squared_distances(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|x_i - y_j|^2 for x (M, D) and y (N, D): (M, N)."""
    return ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)


def differences(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x_id - y_jd for x (M, D) and y (N, D): (D, M, N)."""
    return x.T[:, :, None] - y.T[:, None, :]


def log_np_kernel(x: np.ndarray, y: np.ndarray, s, kernel: str) -> np.ndarray:
    """log k(x_i, y_j) with q = |x_i - y_j|^2 / s^2: gaussian -q, laplacian -sqrt(q), cauchy -log(1 + q),
    inverse_multiquadric -log(1 + q) / 2."""
    q = squared_distances(x, y) / (s * s)
    logs = {
        "gaussian": lambda: -q,
        "laplacian": lambda: -np.sqrt(q),
        "cauchy": lambda: -np.log1p(q),
        "inverse_multiquadric": lambda: -0.5 * np.log1p(q),
    }
    if kernel not in logs:
        raise ValueError(f"unknown kernel {kernel!r}")
    return logs[kernel]()


def np_kernel(x: np.ndarray, y: np.ndarray, s, kernel: str) -> np.ndarray:
    """k(x_i, y_j) = exp(log_np_kernel)."""
    return np.exp(log_np_kernel(x, y, s, kernel))


def grad_np_kernel(x: np.ndarray, y: np.ndarray, s, kernel: str) -> np.ndarray:
    """dk / d|x_i - y_j|^2 of the same kernels."""
    sq = squared_distances(x, y)
    k = np_kernel(x, y, s, kernel)
    slopes = {
        "gaussian": lambda: -k / (s * s),
        "laplacian": lambda: -k / (2 * s * np.sqrt(sq)),
        "cauchy": lambda: -(k**2) / (s * s),
        "inverse_multiquadric": lambda: -0.5 * k**3 / (s * s),
    }
    return slopes[kernel]()


def log_sum_exp(mat: np.ndarray, axis: int = 0) -> np.ndarray:
    """log sum exp of ``mat`` along ``axis``, shifted by the maximum (no overflow)."""
    top = mat.max(axis=axis, keepdims=True)
    return (top + np.log(np.exp(mat - top).sum(axis=axis, keepdims=True))).squeeze(axis)
