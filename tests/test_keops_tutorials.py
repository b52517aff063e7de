"""KeOps 2.3's PyTorch LazyTensor tutorials and examples, run on ``semiring_ops.lazy`` with only the import lines
swapped, and compared with the same scripts run on pykeops.

tests/keops_tutorials/ holds the 14 scripts of KeOps 2.3 that use ``pykeops.torch``'s LazyTensor (README.md there
lists them), unchanged. Each runs in a subprocess (RUNNER: MPLBACKEND=Agg, cwd a temporary folder, CUDA hidden so
that the scripts take their CPU sizes, except plot_multi_gpu.py which needs GPUs; torch's, NumPy's and Python's
generators seeded with SEED first, so both runs draw the same data) as a copy whose lines importing pykeops are
swapped by SWAPS (any other import of pykeops fails the test). Two tests per script:

- ``test_tutorial``: ours alone. It must exit 0, and its own results must be right: what the script prints that
  checks itself (``All good? True``, relative errors against torch), or variables RUNNER dumps after the script
  (``Tutorial.dumped``) checked against a float64 / dense NumPy computation written here. Slow but for the two
  cheapest (RBF interpolation, grid clustering; ~5 s of CPU each): keops_tutorials/README.md lists each cost.
- ``test_tutorial_matches_pykeops`` (where pykeops is importable; slow: pykeops compiles every formula with g++
  and pybind11 on first use, tens of seconds each on 2 cores): what both print is the same, line by line, words
  equal and numbers to the script's rtol, except timings (words only), the printed LazyTensors (KeOps prints its
  formula string, we print ours: both become ``<LazyTensor>``) and the lines each compare function skips (KeOps's
  ``shape`` drops a trailing 1: plot_lazytensors_a.py; float32 residuals that are not the same number in both,
  each checked against a bound instead); and the dumped variables agree.

Stand-ins, where a script needs what this machine or CI lacks: plot_LDDMM_Surface.py imports plotly for its 3-D
figures: without plotly, tests/keops_tutorials/stubs/ (a Figure / Mesh3d that keep their traces) is put on the path;
its data file (hippos_reduc_reduc.pt, 8.5 kB, the CPU one) is vendored under keops_tutorials/data/. plot_knn_mnist.py
downloads MNIST with scikit-learn's ``fetch_openml``: without a network (CI, here), RUNNER answers it with
scikit-learn's own 8 x 8 digits (``load_digits``, 1,797 images) scaled up to 28 x 28 and 0..255, in MNIST's format,
for both runs. plot_grid_cluster_pytorch.py needs ``semiring_ops.lazy.cluster`` (skipped while it is missing), and
plot_multi_gpu.py CUDA GPUs (skipped without).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from peer_scripts import swap_imports

pytest.importorskip("matplotlib")

TUTORIALS = Path(__file__).parent / "keops_tutorials"
SWAPS = (  # (pattern, replacement) for each line importing pykeops; every such line must match one
    (r"^from pykeops\.torch\.cluster import ", "from semiring_ops.lazy.cluster import "),
    (r"^from pykeops\.torch import ", "from semiring_ops.lazy import "),
    (r"^from pykeops\.numpy import ", "from semiring_ops.lazy.numpy import "),
)
SEED = 0
TIMEOUT_S = 1800
HAS_PYKEOPS = importlib.util.find_spec("pykeops") is not None
HAS_PLOTLY = importlib.util.find_spec("plotly") is not None
HAS_CUDA = torch.cuda.is_available()

RUNNER = r"""
import json, random, runpy, sys, warnings
import numpy as np
import torch

config = json.loads(sys.argv[1])


def mnist_standin():
    # scikit-learn's 8 x 8 digits as 28 x 28 images in 0..255, labels as strings: fetch_openml("mnist_784")'s format
    import sklearn.datasets
    from sklearn.utils import Bunch

    real = sklearn.datasets.fetch_openml

    def fetch_openml(name, **kwargs):
        try:
            return real(name, **{**kwargs, "n_retries": 1, "delay": 0.01})
        except OSError as exc:
            print(f"RUNNER: fetch_openml({name!r}) failed ({exc}); using load_digits as MNIST", file=sys.stderr)
        digits = sklearn.datasets.load_digits()
        images = np.kron(digits.images, np.ones((3, 3))) * (255 / 16)
        images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
        return Bunch(data=images.reshape(len(images), 784), target=digits.target.astype(str))

    sklearn.datasets.fetch_openml = fetch_openml


def plain(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().double().tolist()
    return np.asarray(value, dtype=float).tolist()


def figures():
    import matplotlib.pyplot as plt

    out = []
    for number in plt.get_fignums():
        for ax in plt.figure(number).axes:
            out += [np.ma.filled(np.ma.asarray(im.get_array(), dtype=float), np.nan).tolist() for im in ax.images]
    return out


if config["mnist_standin"]:
    mnist_standin()
warnings.filterwarnings("ignore", message="torch.meshgrid")
random.seed(config["seed"])
np.random.seed(config["seed"])
torch.manual_seed(config["seed"])
sys.argv = [config["path"]]
namespace = runpy.run_path(config["path"], run_name="__main__")
dumped = {name: plain(namespace[name]) for name in config["names"]}
if config["figures"]:
    dumped["figures"] = figures()
with open(config["dump"], "w") as f:
    json.dump(dumped, f)
"""
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
OURS = re.compile(r"^((NumPy )?LazyTensor of shape|ReducedLazyTensor\(|callfun of )")  # our printed LazyTensors
KEOPS_OBJECT = re.compile(r"^(KeOps LazyTensor$|<pykeops\.)")  # KeOps's (then indented lines: formula, shape, ...)
TIMING = re.compile(r"[Tt]im(e|ing)|\d+\.\d+s\b")


@dataclass
class Run:
    lines: list[str]  # stdout, without KeOps's compile messages, printed LazyTensors as "<LazyTensor>"
    stdout: str
    dumped: dict[str, np.ndarray | list]
    seconds: float  # wall
    cpu_seconds: float  # user + system, of the subprocess and its children (the compiler)


@dataclass(frozen=True)
class Tutorial:
    """A script, what RUNNER dumps after it, and its checks: ``check(ours)`` and ``compare(theirs, ours)``."""

    name: str
    check: Callable[[Run], None]
    compare: Callable[[Run, Run], None]
    slow: bool  # all but the two cheapest (~5 s of CPU each, cold): keops_tutorials/README.md lists each cost
    dumped: tuple[str, ...] = ()
    figures: bool = False
    marks: tuple = field(default=())


def _swap_imports(text: str) -> str:
    """text with its pykeops import lines swapped by SWAPS (peer_scripts.swap_imports)."""
    return swap_imports(text, "pykeops", SWAPS)


def _normalised(stdout: str) -> list[str]:
    """stdout's lines without KeOps's compile messages, each printed LazyTensor (ours: one line; KeOps's: a header
    and indented lines) as "<LazyTensor>"."""
    out: list[str] = []
    keops_block = False
    for line in stdout.splitlines():
        if line.startswith(("[KeOps]", "[pyKeOps]")):
            continue
        if keops_block and line.startswith("    "):
            continue
        keops_block = bool(KEOPS_OBJECT.match(line))
        out.append("<LazyTensor>" if keops_block or OURS.match(line) else line)
    return out


def _run(script: Path, cwd: Path, tutorial: Tutorial) -> Run:
    """Runs ``script`` as RUNNER does, in ``cwd`` (4 folders deep: plot_LDDMM_Surface.py writes to ../../../../doc)."""
    cwd.mkdir(parents=True)
    shutil.copytree(TUTORIALS / "data", cwd / "data")
    env = {**os.environ, "MPLBACKEND": "Agg"}
    if tutorial.name != "plot_multi_gpu.py":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if not HAS_PLOTLY:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TUTORIALS / "stubs"), env.get("PYTHONPATH")]))
    config = {
        "path": str(script),
        "names": list(tutorial.dumped),
        "figures": tutorial.figures,
        "mnist_standin": tutorial.name == "plot_knn_mnist.py",
        "seed": SEED,
        "dump": str(cwd / "dumped.json"),
    }
    start, cpu_start = time.perf_counter(), _children_cpu()
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(config)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    seconds, cpu_seconds = time.perf_counter() - start, _children_cpu() - cpu_start
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    dumped = json.loads((cwd / "dumped.json").read_text())
    dumped = {k: v if k == "figures" else np.asarray(v) for k, v in dumped.items()}
    return Run(_normalised(proc.stdout), proc.stdout, dumped, seconds, cpu_seconds)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _numbers(line: str) -> list[float]:
    return [float(x) for x in NUMBER.findall(line)]


def _assert_same_print(theirs: Run, ours: Run, rtol: float, skip: tuple[str, ...] = ()) -> None:
    """The printouts agree line by line: the same words, the same numbers to rtol; timing lines by their words only;
    lines containing one of ``skip`` are not compared."""
    assert len(theirs.lines) == len(ours.lines), (
        f"printouts differ:\n--- pykeops\n{theirs.stdout}\n--- ours\n{ours.stdout}"
    )
    for their, our in zip(theirs.lines, ours.lines, strict=True):
        if any(s in their for s in skip):
            continue
        assert NUMBER.split(our) == NUMBER.split(their), f"lines differ:\n  pykeops: {their}\n  ours:    {our}"
        if TIMING.search(their):
            continue
        for a, b in zip(_numbers(their), _numbers(our), strict=True):
            assert math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12), (
                f"numbers differ:\n  pykeops: {their}\n  ours: {our}"
            )


def _value(run: Run, prefix: str) -> list[float]:
    """The numbers of the lines that start with ``prefix``."""
    return [x for line in run.lines if line.startswith(prefix) for x in _numbers(line[len(prefix) :])]


def _close(ours: np.ndarray, theirs: np.ndarray, rtol: float, atol: float, what: str) -> None:
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol, err_msg=what)


# ---------------------------------------------------------------- the checks of each script


def _check_a(ours: Run) -> None:
    numpy_nn, torch_nn = ours.lines[:2]  # the script's nearest neighbours by NumPy, then by torch
    assert _numbers(numpy_nn) == _numbers(torch_nn) and len(_numbers(numpy_nn)) == 10
    (difference,) = _value(ours, "Difference between the two vectors:")
    assert difference < 1e-6  # KeOps's min reduction against torch's
    assert "Actual shape, used internally by KeOps:  (7, 3, 1000, 2000, 1)" in ours.lines
    assert ours.lines[-1] == "a_j is now a <class 'torch.Tensor'> of shape torch.Size([7, 3, 2000, 10])."


def _compare_a(theirs: Run, ours: Run) -> None:
    # KeOps's `shape` drops a vector dimension of 1 (here (7, 3, 1000, 2000)); ours keeps it (docs/lazy.md)
    _assert_same_print(theirs, ours, 1e-6, skip=("Convenient, numpy-friendly shape:", "Difference between"))


def _check_b(ours: Run) -> None:
    (error,) = _value(ours, "Mean squared reconstruction error:")
    assert error < 1e-6
    assert "KMin    reduction of V_ij wrt. the 'M' dimension: torch.Size([2000, 7, 3])" in ours.lines


def _compare_b(theirs: Run, ours: Run) -> None:
    _assert_same_print(theirs, ours, 0.0, skip=("Mean squared reconstruction error",))
    assert max(_value(theirs, "Mean squared reconstruction error:")) < 1e-6


def _gammas(run: Run) -> np.ndarray:
    """plot_lazytensors_c.py's last gamma, sum_j sum_k exp(-|x_i - y_j|^2 / sigma_k^2) beta_j, in float64."""
    x, y, beta, sigmas = (run.dumped[k] for k in ("x", "y", "beta", "sigmas"))
    d2 = ((x[:, None] - y[None]) ** 2).sum(-1)[..., None]
    return (np.exp(-d2 / sigmas**2).sum(-1)[..., None] * beta[None]).sum(1)


def _check_c(ours: Run) -> None:
    _close(ours.dumped["gamma"], _gammas(ours), 1e-5, 1e-6, "gamma")
    assert ours.lines[-1] == "<LazyTensor>"  # print(gammafun)


def _compare_c(theirs: Run, ours: Run) -> None:
    _assert_same_print(theirs, ours, 0.0)
    for key in ("x", "y", "beta", "sigmas"):
        np.testing.assert_array_equal(ours.dumped[key], theirs.dumped[key], err_msg=key)
    _close(ours.dumped["gamma"], theirs.dumped["gamma"], 1e-5, 1e-6, "gamma")


def _check_tensordot(ours: Run) -> None:
    checks = [line for line in ours.lines if not set(line) <= {"-"}]  # between lines of dashes: 41 comparisons
    assert len(checks) == 41 and all(line.endswith("True") for line in checks), ours.stdout


def _compare_same_print(theirs: Run, ours: Run) -> None:
    _assert_same_print(theirs, ours, 0.0)


def _check_mixture(ours: Run) -> None:
    loss = ours.dumped["loss"]
    assert loss.shape == (501,) and np.isfinite(loss).all()
    assert loss[-1] < loss[0] - 1.0  # the fit lowers the negative log-likelihood


def _compare_mixture(theirs: Run, ours: Run) -> None:
    # the same data and start; Adam's 501 float32 steps drift apart slowly from rounding differences
    _close(ours.dumped["loss"][:50], theirs.dumped["loss"][:50], 1e-3, 1e-4, "loss, first 50 steps")
    _close(ours.dumped["loss"][-1], theirs.dumped["loss"][-1], 2e-2, 0.0, "final loss")


def _check_rbf(ours: Run) -> None:
    x, b, a = (ours.dumped[k] for k in ("x", "b", "a"))  # the 2-D problem: (alpha Id + K) a = b, alpha = 10
    k = np.exp(-np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1)) / 0.1)
    residual = 10 * a + k @ a - b
    assert np.linalg.norm(residual) < 1e-4 * np.linalg.norm(b)
    t = ours.dumped["t"]
    mean = np.exp(-np.sqrt(((t[:, None] - x[None]) ** 2).sum(-1)) / 0.1) @ a
    _close(ours.dumped["mean_t"].reshape(-1), mean.reshape(-1), 1e-4, 1e-5, "mean_t")


def _compare_rbf(theirs: Run, ours: Run) -> None:
    _assert_same_print(theirs, ours, 0.0)
    for key in ("x", "b"):
        np.testing.assert_array_equal(ours.dumped[key], theirs.dumped[key], err_msg=key)
    _close(ours.dumped["a"], theirs.dumped["a"], 1e-3, 1e-4, "a")  # both CG to |r|^2 < N eps^2, float32
    _close(ours.dumped["mean_t"], theirs.dumped["mean_t"], 1e-3, 1e-4, "mean_t")


def _kmeans_cosine(x: np.ndarray, k: int = 50, n_iter: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """plot_kmeans_torch.py's KMeans_cosine, dense."""
    c = x[:k] / np.linalg.norm(x[:k], axis=1, keepdims=True)
    for _ in range(n_iter):
        cl = (x @ c.T).argmax(1)
        c = np.zeros_like(c)
        np.add.at(c, cl, x)
        c = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
    return cl, c


def _check_kmeans(ours: Run) -> None:
    cl, c = _kmeans_cosine(ours.dumped["x"])
    np.testing.assert_array_equal(ours.dumped["cl"], cl)
    _close(ours.dumped["c"], c, 1e-10, 1e-12, "c")


def _compare_kmeans(theirs: Run, ours: Run) -> None:
    _assert_same_print(theirs, ours, 0.0)
    np.testing.assert_array_equal(ours.dumped["x"], theirs.dumped["x"])
    np.testing.assert_array_equal(ours.dumped["cl"], theirs.dumped["cl"])
    _close(ours.dumped["c"], theirs.dumped["c"], 1e-10, 1e-12, "c")


def _knn_vote(run: Run) -> np.ndarray:
    """The grid's 50-NN vote of plot_knn_torch.py's last classifier, dense (float64 distances)."""
    x, cl, g = run.dumped["x"], run.dumped["cl"], run.dumped["g"]
    d = ((g[:, None] - x[None]) ** 2).sum(-1)
    nearest = np.argsort(d, axis=1, kind="stable")[:, :50]
    return (cl[nearest].mean(1) > 0.5).reshape(100, 100)


def _check_knn(ours: Run) -> None:
    vote = _knn_vote(ours)  # float32 distances may order near-ties otherwise: a handful of grid points may differ
    assert (ours.dumped["clg"] != vote).sum() <= 10, (ours.dumped["clg"] != vote).sum()


def _compare_knn(theirs: Run, ours: Run) -> None:
    for key in ("x", "cl", "g"):
        np.testing.assert_array_equal(ours.dumped[key], theirs.dumped[key], err_msg=key)
    assert (ours.dumped["clg"] != theirs.dumped["clg"]).sum() <= 10


MNIST_LINE = re.compile(r"3-NN on the full MNIST dataset: test error = (\S+)% in \S+s\.")


def _mnist_error(run: Run) -> float:
    (match,) = [m for m in map(MNIST_LINE.fullmatch, run.lines) if m]
    return float(match[1])


def _check_mnist(ours: Run) -> None:
    assert _mnist_error(ours) < 15.0  # 1,000 training images, 100 tests (both MNIST and the stand-in digits)


def _compare_mnist(theirs: Run, ours: Run) -> None:
    assert abs(_mnist_error(ours) - _mnist_error(theirs)) <= 1.0  # one test image: float32 near-ties


def _check_anisotropic(ours: Run) -> None:
    images = [np.asarray(im) for im in ours.dumped["figures"]]
    assert len(images) == 6 and all(im.shape == (100, 100) and np.isfinite(im).all() for im in images)
    # the first: isotropic, sigma = 0.1, three points with weights 1, 1, 0.5
    y, b = np.array([[0.2, 0.7], [0.5, 0.3], [0.7, 0.5]]), np.array([1.0, 1.0, 0.5])
    ticks = np.linspace(0, 1, 101)[:-1] + 0.005
    xx, yy = np.meshgrid(ticks, ticks)
    grid = np.stack((xx.ravel(), yy.ravel()), 1)
    heat = np.exp(-((grid[:, None] - y[None]) ** 2).sum(-1) / 0.01) @ b
    _close(-images[0].ravel(), heat, 1e-5, 1e-6, "first heatmap")


def _compare_anisotropic(theirs: Run, ours: Run) -> None:
    for k, (a, b) in enumerate(zip(ours.dumped["figures"], theirs.dumped["figures"], strict=True)):
        _close(np.asarray(a), np.asarray(b), 1e-5, 1e-6, f"heatmap {k}")


LOSS = re.compile(r"loss (\S+)")


def _losses(run: Run) -> np.ndarray:
    return np.array([float(x) for x in LOSS.findall(run.stdout)])


def _check_lddmm(ours: Run) -> None:
    losses = _losses(ours)
    assert len(losses) >= 20 and np.isfinite(losses).all()
    assert losses.min() < 0.2 * losses[0]  # the registration fits


def _compare_lddmm(theirs: Run, ours: Run) -> None:
    ours_l, theirs_l = _losses(ours), _losses(theirs)
    _close(ours_l[0], theirs_l[0], 1e-4, 0.0, "first loss")  # then L-BFGS's float32 paths drift apart
    _close(ours_l[1:3], theirs_l[1:3], 1e-2, 0.0, "second and third losses")
    _close(ours_l.min(), theirs_l.min(), 5e-2, 0.0, "best loss")


def _check_invkernel(ours: Run) -> None:
    errors = _value(ours, "Relative error =")
    assert len(errors) == 2 and max(errors) < 1e-3, errors  # the solution and its gradient, against torch's


def _compare_invkernel(theirs: Run, ours: Run) -> None:
    _assert_same_print(theirs, ours, 0.0, skip=("Relative error =",))
    assert max(_value(theirs, "Relative error =")) < 1e-3


def _check_cluster(ours: Run) -> None:
    (error,) = _value(ours, "Relative error:")
    assert error < 1.0  # percent: the kernel is truncated beyond 4 sigma
    assert any(line.startswith("We keep ") for line in ours.lines)


def _compare_cluster(theirs: Run, ours: Run) -> None:
    keep = [line for line in theirs.lines if line.startswith("We keep ")]
    assert keep and keep == [line for line in ours.lines if line.startswith("We keep ")]
    _close(_value(ours, "Relative error:"), _value(theirs, "Relative error:"), 1e-2, 1e-4, "relative error")


def _check_multi_gpu(ours: Run) -> None:
    (line,) = [line for line in ours.lines if line.startswith("relative errors:")]
    assert max(_numbers(line)) < 1e-5


CLUSTER = importlib.util.find_spec("semiring_ops.lazy.cluster") is not None
TUTORIAL_LIST = (
    Tutorial("plot_lazytensors_a.py", _check_a, _compare_a, slow=True),
    Tutorial("plot_lazytensors_b.py", _check_b, _compare_b, slow=True),
    Tutorial("plot_lazytensors_c.py", _check_c, _compare_c, slow=True, dumped=("x", "y", "beta", "sigmas", "gamma")),
    Tutorial("plot_test_tensordot.py", _check_tensordot, _compare_same_print, slow=True),
    Tutorial("plot_gaussian_mixture.py", _check_mixture, _compare_mixture, slow=True, dumped=("loss",)),
    Tutorial(
        "plot_RBF_interpolation_torch.py", _check_rbf, _compare_rbf, slow=False, dumped=("x", "b", "a", "t", "mean_t")
    ),
    Tutorial("plot_kmeans_torch.py", _check_kmeans, _compare_kmeans, slow=True, dumped=("x", "cl", "c")),
    Tutorial("plot_knn_torch.py", _check_knn, _compare_knn, slow=True, dumped=("x", "cl", "g", "clg")),
    Tutorial("plot_knn_mnist.py", _check_mnist, _compare_mnist, slow=True),
    Tutorial("plot_anisotropic_kernels.py", _check_anisotropic, _compare_anisotropic, slow=True, figures=True),
    Tutorial("plot_LDDMM_Surface.py", _check_lddmm, _compare_lddmm, slow=True),
    Tutorial("plot_test_invkernel_torch_helper.py", _check_invkernel, _compare_invkernel, slow=True),
    Tutorial(
        "plot_grid_cluster_pytorch.py",
        _check_cluster,
        _compare_cluster,
        slow=False,
        marks=(pytest.mark.skipif(not CLUSTER, reason="semiring_ops.lazy.cluster is not there yet"),),
    ),
    Tutorial(
        "plot_multi_gpu.py",
        _check_multi_gpu,
        _compare_same_print,
        slow=True,
        marks=(pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA GPUs (a thread per GPU)")),
    ),
)
TUTORIALS_BY_NAME = {t.name: t for t in TUTORIAL_LIST}


def _params(with_pykeops: bool) -> list:
    params = []
    for t in TUTORIAL_LIST:
        marks = [*t.marks]
        if t.slow or with_pykeops:
            marks.append(pytest.mark.extended)
        if with_pykeops:
            marks.append(pytest.mark.skipif(not HAS_PYKEOPS, reason="pykeops is not installed"))
        params.append(pytest.param(t.name, marks=marks, id=t.name.removesuffix(".py")))
    return params


def test_tutorials_are_all_here():
    assert sorted(p.name for p in TUTORIALS.glob("plot_*.py")) == sorted(TUTORIALS_BY_NAME)


@pytest.mark.parametrize("name", _params(with_pykeops=False))
def test_tutorial(name, tmp_path):
    tutorial = TUTORIALS_BY_NAME[name]
    swapped = tmp_path / name
    swapped.write_text(_swap_imports((TUTORIALS / name).read_text()))
    ours = _run(swapped, tmp_path / "ours" / "a" / "b" / "c", tutorial)
    print(f"\n{name}: semiring_ops {ours.seconds:.1f} s ({ours.cpu_seconds:.1f} s CPU)")
    tutorial.check(ours)


@pytest.mark.parametrize("name", _params(with_pykeops=True))
def test_tutorial_matches_pykeops(name, tmp_path):
    tutorial = TUTORIALS_BY_NAME[name]
    swapped = tmp_path / name
    swapped.write_text(_swap_imports((TUTORIALS / name).read_text()))
    theirs = _run(TUTORIALS / name, tmp_path / "pykeops" / "a" / "b" / "c", tutorial)
    ours = _run(swapped, tmp_path / "ours" / "a" / "b" / "c", tutorial)
    print(
        f"\n{name}: pykeops {theirs.seconds:.1f} s ({theirs.cpu_seconds:.1f} s CPU), semiring_ops {ours.seconds:.1f} s "
        f"({ours.cpu_seconds:.1f} s CPU)"
    )
    tutorial.compare(theirs, ours)
