"""torch-semiring-einsum's own tests run against semiring_ops.semiring_einsum: its tests/test_semiring_einsum.py and
tests/test_more_equations.py at the newest commit (a superset of the v1.2.0 tag's tests), kept in
tests/semiring_einsum_suite/ with their license.

At test time the folder is copied into a temporary package and in each file the one ``from torch_semiring_einsum
import (...)`` statement becomes ``from semiring_ops.semiring_einsum import (...)``; nothing else changes. pytest
runs the package in a subprocess and reports every test case; each must pass, except the two that need a GPU
(``test_automatic_block_size_cuda_*``), skipped without one. On a GPU machine the suite also runs a second time with
the device of the tests' setUp (``torch.device('cpu')``) replaced by the GPU and its random generator
(``torch.manual_seed(123)``, the CPU's) by one of the GPU's, so every case runs on CUDA; there a conftest copies
tensors to the host before numpy.testing.assert_allclose reads them (it cannot read GPU tensors).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

SUITE_DIR = Path(__file__).resolve().parent / "semiring_einsum_suite"
TEST_FILES = ("test_semiring_einsum.py", "test_more_equations.py")
IMPORT = "from torch_semiring_einsum import ("
NEEDS_GPU = ("test_automatic_block_size_cuda_no_cache", "test_automatic_block_size_cuda_with_cache")
SETUP_DEVICE = "self.device = torch.device('cpu')"
SETUP_GENERATOR = "self.generator = torch.manual_seed(123)"  # the CPU's: tensors made on the GPU need the GPU's
TIMEOUT_S = 600

_PLUGIN = """\
import pytest
import torch

NEEDS_GPU = {needs_gpu!r}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.name in NEEDS_GPU and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
"""

# the GPU run: the tests hand tensors to numpy.testing.assert_allclose, which reads CPU tensors only
_TO_HOST = """
import numpy

_assert_allclose = numpy.testing.assert_allclose


def _host(x):
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def assert_allclose(actual, desired, *args, **kwargs):
    return _assert_allclose(_host(actual), _host(desired), *args, **kwargs)


numpy.testing.assert_allclose = assert_allclose
"""


def _prepare(tmp_path: Path, device: str) -> Path:
    package = tmp_path / "semiring_einsum_suite"
    shutil.copytree(SUITE_DIR, package)
    (package / "conftest.py").write_text(_PLUGIN.format(needs_gpu=NEEDS_GPU) + (_TO_HOST if device != "cpu" else ""))
    (package / "__init__.py").write_text("")
    for name in TEST_FILES:
        path = package / name
        text = path.read_text()
        assert text.count(IMPORT) == 1, f"{name}: expected one '{IMPORT}'"
        text = text.replace(IMPORT, "from semiring_ops.semiring_einsum import (")
        if device != "cpu":
            assert text.count(SETUP_DEVICE) == 1 and text.count(SETUP_GENERATOR) == 1, name
            text = text.replace(SETUP_DEVICE, f"self.device = torch.device({device!r})")
            text = text.replace(SETUP_GENERATOR, "self.generator = torch.Generator(self.device).manual_seed(123)")
        path.write_text(text)
    return package


def _run(tmp_path: Path, device: str) -> dict[str, str]:
    package = _prepare(tmp_path, device)
    report = tmp_path / "report.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(package)]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                status = f"{child.tag}: {child.get('message', '')[:300]}"
            elif child.tag == "skipped":
                status = "skipped"
        outcomes[f"{case.get('classname').split('.')[-1]}.{case.get('name')}"] = status
    assert outcomes, f"no test ran:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return outcomes


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]
        ),
    ],
)
def test_torch_semiring_einsums_own_tests_pass(tmp_path, device):
    outcomes = _run(tmp_path, device)
    bad = {name: status for name, status in outcomes.items() if status not in ("passed", "skipped")}
    assert not bad, bad
    skipped = {name for name, status in outcomes.items() if status == "skipped"}
    allowed = {f"TestSemiringEinsum.{name}" for name in NEEDS_GPU} if not torch.cuda.is_available() else set()
    assert skipped <= allowed, skipped
    defined = sum((SUITE_DIR / name).read_text().count("    def test_") for name in TEST_FILES)
    assert len(outcomes) == defined, sorted(outcomes)  # every case the files define ran
