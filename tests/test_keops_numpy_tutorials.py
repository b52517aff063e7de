"""KeOps 2.3's NumPy LazyTensor tutorials, run on ``semiring_ops.lazy.numpy`` with only the import lines swapped.

tests/keops_numpy_tutorials/ holds the seven scripts of KeOps 2.3 that use only ``pykeops.numpy``'s LazyTensor
interface (its README lists them, and the Genred / KernelSolve ones left out). Each runs in a subprocess
(MPLBACKEND=Agg, CUDA hidden, cwd a temporary folder) as a copy in which SWAPS rewrite every line importing
pykeops (any other such line fails the test): ``from pykeops.numpy[.cluster|.utils] import ...`` ->
``from semiring_ops.lazy.numpy[.cluster|.utils] import ...``, and ``import pykeops.config`` -> a stand-in whose
``config.gpu_available`` is False (the scripts read nothing else of it), so both runs take the CPU sizes. RUNNER
seeds NumPy's global generator (the scripts draw from it unseeded) and saves a few of the script's variables.

- test_tutorial[name]: our run exits 0 and its numbers agree with NumPy (CHECKS: dense float64 or float32
  references of what the script computes: the eigenvalues, the interpolation's linear solve, the k-means labels,
  the k nearest neighbours, the block-sparse products). Each run costs ~5 s of interpreter start-up; the
  scripts whose own work takes more than a few seconds on 2 cores are marked slow (SLOW).
- test_tutorial_matches_pykeops[name] (slow; skipped without pykeops): the unchanged script on pykeops.numpy,
  with the same seed, prints the same text and numbers (timings aside; the LazyTensor printouts differ in form)
  and leaves the same variables, to each script's tolerance (TOLERANCES). pykeops compiles each of its
  formulas on first use (~25 s apiece on 2 cores), hence slow. Run times of both are printed (``-s``).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from peer_scripts import swap_imports

pytest.importorskip("matplotlib")
pytest.importorskip("scipy")

TUTORIALS = Path(__file__).parent / "keops_numpy_tutorials"
REPO = Path(__file__).resolve().parent.parent
NAMES = (
    "plot_RBF_interpolation_numpy.py",
    "plot_grid_cluster_numpy.py",
    "plot_kmeans_numpy.py",
    "plot_knn_numpy.py",
    "plot_scipy.py",
    "plot_test_invkernel_numpy_helper.py",
    "plot_test_softmax_numpy_helper.py",
)
# CPU seconds of our run on 2 (shared) cores, of which ~5 s start the interpreter (torch, matplotlib, scipy):
# RBF 6, grid_cluster 5, kmeans 5 (the fast ones); knn 7 (5 k-best kernels to compile), softmax 8 (its NumPy
# reference: 5 s), invkernel 11 (scipy's cg, 2 x ~100 products, and NumPy's solve), scipy 40 (its block-sparse
# eigsh: hundreds of products, each a Python loop over the blocks of the ranges)
SLOW = {
    "plot_knn_numpy.py",
    "plot_scipy.py",
    "plot_test_invkernel_numpy_helper.py",
    "plot_test_softmax_numpy_helper.py",
}
CONFIG = "from types import SimpleNamespace; pykeops = SimpleNamespace(config=SimpleNamespace(gpu_available=False))"
SWAPS = (  # (pattern, replacement) for each line importing pykeops; every such line must match one
    (r"^from pykeops\.numpy(\.cluster|\.utils)? import ", r"from semiring_ops.lazy.numpy\1 import "),
    (r"^import pykeops\.config$", CONFIG + "  # was: import pykeops.config"),
)
SEED = 0
TIMEOUT_S = 1800
DUMPED = {  # the script's global variables RUNNER saves (arrays; a tuple of arrays as name_0, name_1, ...)
    "plot_RBF_interpolation_numpy.py": ("x", "b", "a", "alpha", "mean_t"),
    "plot_grid_cluster_numpy.py": ("x", "y", "b", "x_labels", "y_labels", "ranges_ij", "a_full", "a_sparse"),
    "plot_kmeans_numpy.py": ("x", "cl", "c"),
    "plot_knn_numpy.py": ("x", "g", "cl", "K", "indKNN", "clg"),
    "plot_scipy.py": ("x", "x_labels", "keep", "sigma", "ranges_ij", "eigenvalues", "D"),
    "plot_test_invkernel_numpy_helper.py": ("x", "b", "g", "alpha", "c", "c_sp", "c_np"),
    "plot_test_softmax_numpy_helper.py": ("x", "y", "b", "c", "cc"),
}
RUNNER = """
import runpy, sys
import numpy as np

path, seed, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
np.random.seed(seed)
sys.argv = [path]
namespace = runpy.run_path(path, run_name="__main__")
arrays = {}
for name in names:
    value = namespace[name]
    if isinstance(value, tuple):
        arrays.update({f"{name}_{k}": np.asarray(v) for k, v in enumerate(value)})
    else:
        arrays[name] = np.asarray(value)
np.savez("dumped.npz", **arrays)
"""
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
IGNORED = re.compile(r"^\[(py)?KeOps\]|^KeOps LazyTensor|^NumPy LazyTensor|^ {4}(formula|shape|reduction): ")
TIMING = re.compile(r"(?i)\btim(e|ing)\b|computed in|convolution, |Perform clus|Compute ranges|Sort the|Process the")
TOLERANCES = {  # name -> (rtol, atol) of the printed numbers and the saved float arrays, against pykeops
    "plot_RBF_interpolation_numpy.py": (1e-9, 1e-12),
    "plot_grid_cluster_numpy.py": (1e-5, 1e-5),  # float32 sums of 2000 terms
    "plot_kmeans_numpy.py": (1e-6, 1e-7),
    "plot_knn_numpy.py": (0.0, 0.0),
    "plot_scipy.py": (1e-5, 1e-4),  # float32 eigsh: eigenvalues up to 140 to float32 precision
    "plot_test_invkernel_numpy_helper.py": (1e-7, 1e-6),  # the relative errors printed are ~1e-6 themselves
    "plot_test_softmax_numpy_helper.py": (1e-12, 1e-12),
}
ARRAY_TOLERANCES = {  # (name, variable) -> (rtol, atol) where TOLERANCES' are too tight
    # scipy's cg on aslinearoperator(K), stopped at |r| <= 1e-5 |b|: products that differ in the last bits
    # (summation order) give iterates that differ by ~1e-5 of the solution's size (30)
    ("plot_test_invkernel_numpy_helper.py", "c_sp"): (1e-5, 1e-4),
}


@dataclass
class Run:
    stdout: str
    dumped: dict[str, np.ndarray]
    seconds: float


def _swap_imports(text: str) -> str:
    """text with its pykeops import lines swapped by SWAPS (peer_scripts.swap_imports)."""
    return swap_imports(text, "pykeops", SWAPS)


def _run(script: Path, cwd: Path, name: str) -> Run:
    cwd.mkdir()
    env = {**os.environ, "MPLBACKEND": "Agg", "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(script), str(SEED), *DUMPED[name]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    with np.load(cwd / "dumped.npz") as dumped:
        return Run(proc.stdout, dict(dumped), seconds)


def _ours(name: str, tmp_path: Path) -> Run:
    swapped = tmp_path / name
    swapped.write_text(_swap_imports((TUTORIALS / name).read_text()))
    return _run(swapped, tmp_path / "ours", name)


# ---------------------------------------------------------------- our numbers against NumPy


def _sqdist(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|x_i - y_j|^2 in float64: (M, N)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    return ((x[:, None] - y[None]) ** 2).sum(-1)


def _mask(d: dict[str, np.ndarray], m: int, n: int) -> np.ndarray:
    """The (m, n) pairs (i, j) that the dumped ranges_ij (ranges_i, slices_i, redranges_j, ...) keep."""
    mask = np.zeros((m, n), dtype=bool)
    starts = [0, *d["ranges_ij_1"].tolist()]
    for k, (a, b) in enumerate(d["ranges_ij_0"].tolist()):
        for c, e in d["ranges_ij_2"][starts[k] : starts[k + 1]].tolist():
            mask[a:b, c:e] = True
    return mask


def _check_rbf(run: Run) -> None:
    """The last solve (the 2-D Laplacian kernel, alpha = 10): a = (alpha Id + K_xx)^-1 b, and K_tx a."""
    d = run.dumped
    kernel = np.exp(-np.sqrt(_sqdist(d["x"], d["x"])) / 0.1)
    want = np.linalg.solve(kernel + d["alpha"] * np.eye(len(d["x"])), d["b"])
    np.testing.assert_allclose(d["a"], want, rtol=1e-5, atol=1e-6)  # conjugate gradients to |r| ~ 1e-6 sqrt(N)
    assert d["mean_t"].shape == (101, 101) and np.isfinite(d["mean_t"]).all()


def _check_grid_cluster(run: Run) -> None:
    """a_full = K b and a_sparse = (K masked by the ranges) b, and the printed relative error; the ranges keep the
    pairs of points in kept pairs of clusters."""
    d = run.dumped
    kernel = np.exp(-_sqdist(d["x"] / 0.05, d["y"] / 0.05) / 2)
    mask = _mask(d, len(d["x"]), len(d["y"]))
    assert f"We keep {mask.sum():.2e}/" in run.stdout  # the script's sum of the kept blocks' areas
    b = d["b"].astype(np.float64)
    np.testing.assert_allclose(d["a_full"], kernel @ b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(d["a_sparse"], (kernel * mask) @ b, rtol=1e-4, atol=1e-5)
    error = 100 * np.abs(d["a_sparse"] - d["a_full"]).sum() / np.abs(d["a_full"]).sum()
    printed = float(re.search(r"Relative error:\s+(\S+)%", run.stdout)[1])
    assert math.isclose(printed, error, abs_tol=1e-4)


def _check_kmeans(run: Run) -> None:
    """The same 10 Lloyd iterations in NumPy (float32 distances, as the script's) give the same labels and
    centroids."""
    x = run.dumped["x"]
    c = x[:50].copy()
    for _ in range(10):
        cl = ((x[:, None, :] - c[None, :, :]) ** 2).sum(-1).argmin(1)
        counts = np.bincount(cl).astype(np.float32)
        for k in range(2):
            c[:, k] = np.bincount(cl, weights=x[:, k]) / counts
    agree = (cl == run.dumped["cl"]).mean()
    assert agree > 0.999, f"{agree:.2%} of the labels agree with NumPy's k-means"
    np.testing.assert_allclose(run.dumped["c"], c, rtol=1e-3, atol=1e-4)


def _check_knn(run: Run) -> None:
    """indKNN (K = 50, the last) are the K nearest samples of each grid point (their distances are the K smallest,
    nearest first), and the classification is their majority vote."""
    d = run.dumped
    dist = (((d["g"][:, None] - d["x"][None]) ** 2).sum(-1)).astype(np.float32)
    k = int(d["K"])
    got = np.take_along_axis(dist, d["indKNN"], 1)
    np.testing.assert_allclose(got, np.sort(dist, 1)[:, :k], rtol=1e-6, atol=1e-7)
    assert all(len(set(row)) == k for row in d["indKNN"].tolist())
    np.testing.assert_array_equal(d["clg"].reshape(-1), d["cl"][d["indKNN"]].mean(1) > 0.5)


def _check_scipy(run: Run) -> None:
    """The 7 smallest eigenvalues of the block-sparse normalized graph Laplacian Id - D^-1/2 K D^-1/2 (K the
    Gaussian kernel of the sorted swiss roll, kept on pairs of points in kept pairs of clusters)."""
    d = run.dumped
    mask = _mask(d, len(d["x"]), len(d["x"]))
    np.testing.assert_array_equal(mask, d["keep"][d["x_labels"]][:, d["x_labels"]])
    kernel = np.exp(-_sqdist(d["x"], d["x"]) / (2 * float(d["sigma"]) ** 2)) * mask
    degree = kernel.sum(1)
    np.testing.assert_allclose(d["D"], degree, rtol=1e-5)
    laplacian = np.eye(len(degree)) - kernel / np.sqrt(degree)[:, None] / np.sqrt(degree)[None, :]
    np.testing.assert_allclose(np.sort(d["eigenvalues"]), np.linalg.eigvalsh(laplacian)[:7], atol=1e-4)


def _check_invkernel(run: Run) -> None:
    """c (LazyTensor.solve) and c_sp (scipy's cg on aslinearoperator(K)) solve (alpha Id + K) c = b."""
    d = run.dumped
    system = np.exp(-d["g"] * _sqdist(d["x"], d["x"])) + d["alpha"] * np.eye(len(d["x"]))
    np.testing.assert_allclose(d["c"], np.linalg.solve(system, d["b"]), rtol=1e-4, atol=1e-5)
    for k in range(d["b"].shape[1]):  # scipy's cg stops at |r| <= 1e-5 |b|: c_sp is only as close as that
        residual = np.linalg.norm(system @ d["c_sp"][:, k] - d["b"][:, k])
        assert residual <= 1.01e-5 * np.linalg.norm(d["b"][:, k]), residual


def _check_softmax(run: Run) -> None:
    """c = sum_j softmax_j(|x_i - y_j|^2) b_j (the script's NumPy cc), in float64."""
    np.testing.assert_allclose(run.dumped["c"], run.dumped["cc"], rtol=1e-12, atol=1e-14)


CHECKS = {
    "plot_RBF_interpolation_numpy.py": _check_rbf,
    "plot_grid_cluster_numpy.py": _check_grid_cluster,
    "plot_kmeans_numpy.py": _check_kmeans,
    "plot_knn_numpy.py": _check_knn,
    "plot_scipy.py": _check_scipy,
    "plot_test_invkernel_numpy_helper.py": _check_invkernel,
    "plot_test_softmax_numpy_helper.py": _check_softmax,
}


def test_tutorials_are_all_here():
    assert sorted(p.name for p in TUTORIALS.glob("plot_*.py")) == sorted(NAMES) == sorted(CHECKS) == sorted(DUMPED)
    assert sorted(TOLERANCES) == sorted(NAMES) and (TUTORIALS / "LICENSE.txt").exists()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.extended) if n in SLOW else n for n in NAMES])
def test_tutorial(name, tmp_path):
    ours = _ours(name, tmp_path)
    print(f"\n{name}: semiring_ops {ours.seconds:.1f} s")
    CHECKS[name](ours)


# ---------------------------------------------------------------- against pykeops.numpy


def _printout(text: str) -> tuple[list[str], list[float]]:
    """The words between the numbers (spaces collapsed: NumPy pads and wraps a printed array by its widest
    number) and the numbers of ``text``, without its IGNORED lines and with the numbers of its TIMING lines left
    out."""
    lines = [line for line in text.splitlines() if line.strip() and not IGNORED.search(line)]
    joined = " ".join(NUMBER.sub("<time>", line) if TIMING.search(line) else line for line in lines)
    return [" ".join(part.split()) for part in NUMBER.split(joined)], [float(x) for x in NUMBER.findall(joined)]


def _assert_same_print(theirs: str, ours: str, rtol: float, atol: float) -> None:
    """The two printouts have the same words and numbers (to rtol, atol), as _printout reads them."""
    (their_words, their_numbers), (our_words, our_numbers) = _printout(theirs), _printout(ours)
    assert our_words == their_words, f"printouts differ:\n--- pykeops\n{theirs}\n--- ours\n{ours}"
    for index, (a, b) in enumerate(zip(their_numbers, our_numbers, strict=True)):
        assert math.isclose(a, b, rel_tol=rtol, abs_tol=atol), f"number {index}: pykeops {a}, ours {b}\n{ours}"


@pytest.mark.extended
@pytest.mark.skipif(importlib.util.find_spec("pykeops") is None, reason="pykeops is not installed")
@pytest.mark.parametrize("name", NAMES)
def test_tutorial_matches_pykeops(name, tmp_path):
    ours = _ours(name, tmp_path)
    theirs = _run(TUTORIALS / name, tmp_path / "pykeops", name)
    print(f"\n{name}: pykeops {theirs.seconds:.1f} s, semiring_ops {ours.seconds:.1f} s")
    rtol, atol = TOLERANCES[name]
    _assert_same_print(theirs.stdout, ours.stdout, rtol, atol)
    assert sorted(ours.dumped) == sorted(theirs.dumped)
    for key, want in theirs.dumped.items():
        got = ours.dumped[key]
        assert got.shape == want.shape and got.dtype == want.dtype, (key, got.shape, got.dtype, want.shape, want.dtype)
        if np.issubdtype(want.dtype, np.floating):
            key_rtol, key_atol = ARRAY_TOLERANCES.get((name, key), (rtol, atol))
            np.testing.assert_allclose(got, want, rtol=key_rtol, atol=key_atol, err_msg=f"{name}: {key}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"{name}: {key}")
