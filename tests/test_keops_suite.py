"""KeOps's own LazyTensor tests, run against semiring_ops.lazy.

The test files come from the installed pykeops 2.3 (the ``test`` extra installs it; it ships its tests as the
package ``pykeops.test``). They are read, not imported, and not copied into this repository: at test time each
file is rewritten into a temporary folder with its imports swapped and nothing else changed:

- ``from pykeops.torch import LazyTensor, Vi, Vj, Pm`` -> ``from semiring_ops.lazy import ...``;
- ``from pykeops.numpy import LazyTensor`` -> ``from semiring_ops.lazy.numpy import LazyTensor``;
- test_torch.py's ``import pykeops`` / ``import pykeops.config`` are dropped (only its Genred tests use them) and
  its NumPy reference functions (``from pykeops.numpy.utils import ...``) come from tests/keops_numpy_reference.py;
- test_torch_func.py's ``import keopscore`` (KeOps' code generator, whose ``auto_factorize`` flag it sets)
  becomes a namespace that takes the flag and does nothing.

pykeops itself is never imported. The rewritten files run with pytest in a subprocess, once per variant:
on the CPU with the generated kernels, on the CPU with the PyTorch fallback (SEMIRING_OPS_LAZY_BACKEND=torch),
and on CUDA when there is a GPU (the files pick "cuda" themselves when CUDA is visible; the CPU variants hide
it with CUDA_VISIBLE_DEVICES=""). Each KeOps test is one item here, passing or failing with its own report.

Run: the LazyTensor test files (test_lazytensor_*.py, test_sinc.py, test_complex*.py), the torch.func ones
(test_vmap.py, test_torch_func.py, test_torch_func_logsumexp.py) and the LazyTensor tests of test_torch.py.
test_torch.py's other tests call Genred / KernelSolve, KeOps's string-formula API, which semiring_ops does not
offer: they are listed here as skipped, with that reason.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HAS_CUDA

KEOPS_VERSION = "2.3"
FILES = (
    "test_complex.py",
    "test_complex_numpy.py",
    "test_lazytensor_clamp.py",
    "test_lazytensor_gaussian_batch.py",
    "test_lazytensor_gaussian_cpu.py",
    "test_lazytensor_gaussian_fromhost.py",
    "test_lazytensor_gaussian_inplace.py",
    "test_lazytensor_gaussian_numpy_inplace.py",
    "test_lazytensor_grad.py",
    "test_lazytensor_tensordot.py",
    "test_sinc.py",
    "test_torch.py",
    "test_torch_func.py",
    "test_torch_func_logsumexp.py",
    "test_vmap.py",
)
# what semiring_ops.lazy offers of pykeops.torch / pykeops.numpy
LAZY_NAMES = {"ComplexLazyTensor", "LazyTensor", "Vi", "Vj", "Pm"}
OUT_OF_SCOPE = "calls Genred / KernelSolve, KeOps's string-formula API (not offered by semiring_ops.lazy)"
TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
TIMEOUT_S = 1800


def _keops_tests() -> tuple[Path | None, str]:
    """(the folder of pykeops's test files, why not) without importing pykeops (its import compiles on GPUs)."""
    spec = importlib.util.find_spec("pykeops")
    if spec is None or not spec.submodule_search_locations:
        return None, "pykeops is not installed (pip install -e '.[test]' installs pykeops==2.3, whose tests this runs)"
    root = Path(next(iter(spec.submodule_search_locations)))
    version = (root / "keops_version").read_text().strip() if (root / "keops_version").exists() else "?"
    if version != KEOPS_VERSION:
        return None, f"pykeops {version} is installed; this suite runs the tests of pykeops {KEOPS_VERSION}"
    missing = [f for f in FILES if not (root / "test" / f).exists()]
    if missing:
        return None, f"pykeops {version} at {root} lacks its test files {missing}"
    return root / "test", ""


def _imports_of(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _pykeops_imports(node: ast.AST) -> list[tuple[str, set[str]]]:
    out = []
    for imp in _imports_of(node):
        if isinstance(imp, ast.ImportFrom) and (imp.module or "").startswith("pykeops"):
            out.append((imp.module, {a.name for a in imp.names}))
        elif isinstance(imp, ast.Import):
            out += [(a.name, set()) for a in imp.names if a.name.startswith("pykeops")]
    return out


def _is_lazy_test(fn: ast.FunctionDef) -> bool:
    """A test that uses only the LazyTensor API of pykeops.torch (test_torch.py mixes them with Genred tests)."""
    used = _pykeops_imports(fn)
    return bool(used) and all(mod == "pykeops.torch" and names <= LAZY_NAMES for mod, names in used)


def _collect(folder: Path) -> list[tuple[str, str | None]]:
    """(pytest node id in the rewritten folder, reason to skip or None) for every test of FILES."""
    items: list[tuple[str, str | None]] = []
    for name in FILES:
        tree = ast.parse((folder / name).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                items.append((f"{name}::{node.name}", None))
            elif isinstance(node, ast.ClassDef):
                unittest_case = any(isinstance(b, ast.Attribute) and b.attr == "TestCase" for b in node.bases)
                if not (node.name.startswith("Test") or unittest_case):
                    continue
                for fn in node.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test"):
                        skip = None if name != "test_torch.py" or _is_lazy_test(fn) else OUT_OF_SCOPE
                        items.append((f"{name}::{node.name}::{fn.name}", skip))
    return items


def _rewrite(source: str) -> str:
    """The source with its pykeops imports swapped (see the module docstring); every other line as it was."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for imp in _imports_of(tree):
        pad = " " * imp.col_offset
        if isinstance(imp, ast.ImportFrom) and imp.module in ("pykeops.torch", "pykeops.numpy"):
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in imp.names)
            if {a.name for a in imp.names} <= LAZY_NAMES:
                target = "semiring_ops.lazy" if imp.module == "pykeops.torch" else "semiring_ops.lazy.numpy"
                edits.append((imp.lineno, imp.end_lineno, f"{pad}from {target} import {names}\n"))
        elif isinstance(imp, ast.ImportFrom) and imp.module == "pykeops.numpy.utils":
            names = ", ".join(a.name for a in imp.names)
            edits.append((imp.lineno, imp.end_lineno, f"{pad}from keops_numpy_reference import {names}\n"))
        elif isinstance(imp, ast.Import) and all(a.name.startswith("pykeops") for a in imp.names):
            edits.append((imp.lineno, imp.end_lineno, f"{pad}pass  # was: import pykeops\n"))
        elif isinstance(imp, ast.Import) and [a.name for a in imp.names] == ["keopscore"]:
            stub = "import types; keopscore = types.SimpleNamespace()  # was: import keopscore"
            edits.append((imp.lineno, imp.end_lineno, f"{pad}{stub}\n"))
    for first, last, text in sorted(edits, reverse=True):
        lines[first - 1 : last] = [text]
    return "".join(lines)


_CONFTEST = '''"""Written by tests/test_keops_suite.py: records every test's outcome for it."""
import json
import os

_results = {}
_rank = {"passed": 0, "skipped": 1, "failed": 2}


def _put(nodeid, outcome, text):
    old = _results.get(nodeid)
    if old is None or _rank[outcome] > _rank[old["outcome"]]:
        _results[nodeid] = {"outcome": outcome, "text": text}


def pytest_collectreport(report):
    if report.failed:
        _put(report.nodeid, "failed", "collection error:\\n" + str(report.longrepr))


def pytest_runtest_logreport(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        _put(report.nodeid, "skipped", str(report.longrepr[2]))
    else:
        _put(report.nodeid, report.outcome, "" if report.passed else str(report.longrepr))


def pytest_sessionfinish(session):
    with open(os.environ["KEOPS_SUITE_RESULTS"], "w") as f:
        json.dump(_results, f)
'''

VARIANTS = {
    "cpu": {"CUDA_VISIBLE_DEVICES": ""},
    "cpu-torch-fallback": {"CUDA_VISIBLE_DEVICES": "", "SEMIRING_OPS_LAZY_BACKEND": "torch"},
    "cuda": {},
}

FOLDER, WHY_NOT = _keops_tests()
ITEMS = _collect(FOLDER) if FOLDER is not None else []


@pytest.fixture(scope="session")
def keops_suite(tmp_path_factory):
    """run(variant) -> {node id: {"outcome", "text"}}: the rewritten suite run once per variant, in a subprocess."""
    folder = tmp_path_factory.mktemp("keops_suite")
    for name in FILES:
        (folder / name).write_text(_rewrite((FOLDER / name).read_text()))
    (folder / "conftest.py").write_text(_CONFTEST)
    (folder / "pytest.ini").write_text("[pytest]\n")
    done: dict[str, dict] = {}

    def run(variant: str) -> dict:
        if variant not in done:
            results = folder / f"results-{variant}.json"
            env = {**os.environ, **VARIANTS[variant], "KEOPS_SUITE_RESULTS": str(results)}
            env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS_DIR), env.get("PYTHONPATH", "")])
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(folder / "pytest.ini")]
            cmd += ["--rootdir", str(folder), "--continue-on-collection-errors", *FILES]
            cmd += [f"--deselect={nodeid}" for nodeid, skip in ITEMS if skip is not None]
            proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            if not results.exists():
                pytest.fail(f"the KeOps suite did not run ({variant}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
            done[variant] = json.loads(results.read_text())
            done[variant]["__log__"] = {"outcome": "log", "text": proc.stdout[-4000:] + proc.stderr[-2000:]}
        return done[variant]

    return run


def _params():
    if FOLDER is None:
        return [pytest.param("none", "none", None, marks=pytest.mark.skip(reason=WHY_NOT), id="keops-suite")]
    out = []
    for variant in VARIANTS:
        marks = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")] if variant == "cuda" else []
        for nodeid, skip in ITEMS:
            item_marks = [*marks, pytest.mark.skip(reason=skip)] if skip else marks
            out.append(pytest.param(variant, nodeid, skip, marks=item_marks, id=f"{variant}-{nodeid}"))
    return out


@pytest.mark.parametrize(("variant", "nodeid", "skip"), _params())
def test_keops(keops_suite, variant, nodeid, skip):
    """One of KeOps's tests, with semiring_ops.lazy in place of pykeops."""
    results = keops_suite(variant)
    file = nodeid.split("::")[0]
    got = results.get(nodeid) or (results.get(file) if results.get(file, {}).get("outcome") == "failed" else None)
    if got is None:
        pytest.fail(f"{nodeid} did not run ({variant}); the suite's output:\n{results['__log__']['text']}")
    if got["outcome"] == "skipped":
        pytest.skip(got["text"])
    if got["outcome"] != "passed":
        report = re.sub(r"\n{3,}", "\n\n", got["text"])[-6000:]
        pytest.fail(f"{nodeid} ({variant}):\n{report}", pytrace=False)
