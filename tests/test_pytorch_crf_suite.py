"""pytorch-crf's own test suite run against LinearChainCRF: its tests/test_crf.py at the v0.7.2 tag with the one
line ``from torchcrf import CRF`` replaced by ``from semiring_ops.structures import LinearChainCRF as CRF``.

The file is pytorch-crf's, so it is not in this repository. Neither the wheel nor the sdist on PyPI ships it
(pytorch-crf 0.7.1 and 0.7.2 sdists hold torchcrf/ and packaging files only; 0.7.0 has no sdist), so the test
gets it at test time from the one place it is published, GitHub, at the commit the v0.7.2 tag names, and checks
its SHA-256 before running anything; a good copy is kept in pytest's cache (.pytest_cache), so only the first
run needs the network. Where to find it, in order:

    SEMIRING_OPS_PYTORCH_CRF_TESTS=/path/to/test_crf.py   a local copy (an offline machine; still hash-checked)
    pytest's cache                                          a copy fetched by an earlier run
    https://raw.githubusercontent.com/kmkurn/pytorch-crf/<commit>/tests/test_crf.py   two tries, 30 s each

If none answers the test is skipped, saying why; SEMIRING_OPS_REQUIRE_PYTORCH_CRF_SUITE=1 turns that skip into a
failure (for a CI job that must not lose the check silently).

Both the original (against the installed torchcrf, which must be 0.7.2) and the swapped file run, each in its own
pytest process. A test may fail with ours only if it is in EXPECTED_DIFFERENCES below (the documented, deliberate
differences, also listed in docs/structures.md, each checked to fail for its stated reason); a test that fails
with pytorch-crf itself in this environment must fail with ours in the same way (with torch 2.13 and pytest 9,
four of its tests compare pytest.approx against a tensor that requires grad and fail for pytorch-crf too).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

import semiring_ops

VERSION = "0.7.2"
COMMIT = "8f3203a1f1d7984c87718bfe31853242670258db"  # what the v0.7.2 tag of github.com/kmkurn/pytorch-crf names
URL = f"https://raw.githubusercontent.com/kmkurn/pytorch-crf/{COMMIT}/tests/test_crf.py"
SHA256 = "65b1b0236b27ed36a6df5991ea41a6733b54d87ceedcf249012a3db83e12c69d"
THEIR_IMPORT = "from torchcrf import CRF"
OUR_IMPORT = "from semiring_ops.structures import LinearChainCRF as CRF"
LOCAL_COPY = "SEMIRING_OPS_PYTORCH_CRF_TESTS"
REQUIRE = "SEMIRING_OPS_REQUIRE_PYTORCH_CRF_SUITE"


@dataclass(frozen=True)
class Difference:
    """Why a pytorch-crf test fails with ours, and a regex its failure message must match (so that it fails for
    that reason and no other)."""

    reason: str
    failure: str


_EMISSIONS_RANK = Difference(
    "error wording: ours names the argument, the layout it must have and its shape ('emissions must be 3-D "
    "(seq_length, batch_size, num_tags) with batch_first=False, got shape (1, 2)'), where pytorch-crf says "
    "'emissions must have dimension of 3, got 2'",
    r"emissions must be 3-D \(seq_length, batch_size, num_tags\) with batch_first=False, got shape \(1, 2\)",
)
_NUM_TAGS = Difference(
    "error wording: 'emissions must have shape (seq_length, batch_size, num_tags) = (1, 2, 10) with "
    "batch_first=False (this CRF has num_tags=10), got shape (1, 2, 3)', where pytorch-crf says 'expected last "
    "dimension of emissions is 10, got 3'",
    r"emissions must have shape \(seq_length, batch_size, num_tags\) = \(1, 2, 10\)",
)
_LENGTH_ZERO = Difference(
    "length-0 sequences are allowed (their log-likelihood is 0, their decode []), so a mask whose first step is "
    "off is not an error; pytorch-crf requires the first step of every sequence on",
    r"DID NOT RAISE|tags must lie in \[0, 4\)",  # forward's tags are torch.empty: garbage may be out of range
)
EXPECTED_DIFFERENCES: dict[str, Difference] = {
    "TestInit::test_minimal": Difference(
        "the class is LinearChainCRF, and its repr shows batch_first (and validate=False when set): "
        "'LinearChainCRF(num_tags=10, batch_first=False)' where pytorch-crf gives 'CRF(num_tags=10)'",
        r"LinearChainCRF\(num_tags=10, batch_first=False\)",
    ),
    "TestForward::test_emissions_has_bad_number_of_dimension": _EMISSIONS_RANK,
    "TestDecode::test_emissions_has_bad_number_of_dimension": _EMISSIONS_RANK,
    "TestForward::test_emissions_last_dimension_not_equal_to_number_of_tags": _NUM_TAGS,
    "TestDecode::test_emissions_last_dimension_not_equal_to_number_of_tags": _NUM_TAGS,
    "TestForward::test_emissions_and_tags_size_mismatch": Difference(
        "error wording: 'tags must have shape (seq_length, batch_size) = (1, 2) with batch_first=False, the first "
        "two dimensions of emissions (shape (1, 2, 3)), got shape (2, 2)', where pytorch-crf says 'the first two "
        "dimensions of emissions and tags must match, got (1, 2) and (2, 2)'",
        r"tags must have shape \(seq_length, batch_size\) = \(1, 2\) with batch_first=False",
    ),
    "TestDecode::test_emissions_and_mask_size_mismatch": Difference(
        "error wording: 'mask must have shape (seq_length, batch_size) = (1, 2) ...', where pytorch-crf says "
        "'the first two dimensions of emissions and mask must match, got (1, 2) and (2, 2)'",
        r"mask must have shape \(seq_length, batch_size\) = \(1, 2\) with batch_first=False",
    ),
    "TestForward::test_first_timestep_mask_is_not_all_on": _LENGTH_ZERO,
    "TestDecode::test_first_timestep_mask_is_not_all_on": _LENGTH_ZERO,
}


@dataclass(frozen=True)
class Outcome:
    passed: bool
    message: str  # the failure's message, "" for a pass


def _verified(data: bytes, origin: str) -> str:
    """The file's text, if its bytes are v0.7.2's; a different file is an error, never a skip."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise AssertionError(
            f"pytorch-crf's tests/test_crf.py from {origin} has SHA-256 {digest}, not {SHA256} (v{VERSION})"
        )
    return data.decode()


def _upstream_tests(cache_dir: Path | None) -> str:
    """pytorch-crf v0.7.2's tests/test_crf.py (see the module docstring for where it comes from)."""
    local = os.environ.get(LOCAL_COPY)
    if local:
        return _verified(Path(local).read_bytes(), local)
    cached = None if cache_dir is None else cache_dir / "test_crf.py"
    if cached is not None and cached.exists() and hashlib.sha256(cached.read_bytes()).hexdigest() == SHA256:
        return cached.read_text()
    errors = []
    for attempt in range(2):
        try:
            with urllib.request.urlopen(URL, timeout=30) as response:
                data = response.read()
            text = _verified(data, URL)
            if cached is not None:
                cached.write_bytes(data)
            return text
        except OSError as e:  # URLError, timeouts, DNS: the network, not the file
            errors.append(f"{type(e).__name__}: {e}")
            time.sleep(2 * (attempt + 1))
    reason = (
        f"pytorch-crf's test file is not shipped on PyPI and could not be fetched from {URL} ({'; '.join(errors)}); "
        f"set {LOCAL_COPY} to a copy of it (tests/test_crf.py at pytorch-crf's v{VERSION} tag) to run this test"
    )
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _run(source: str, folder: Path) -> dict[str, Outcome]:
    """Runs one test file in its own pytest process (no conftest or settings of ours) -> {Class::test: outcome}."""
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\n")
    (folder / "test_crf.py").write_text(source)
    report = folder / "report.xml"
    # this checkout's semiring_ops, whatever the working directory; -vv: assertion messages in full
    path = [str(Path(semiring_ops.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    cmd = [sys.executable, "-m", "pytest", "-vv", "-p", "no:cacheprovider", "-c", str(folder / "pytest.ini")]
    cmd += ["--rootdir", str(folder), f"--junitxml={report}", str(folder / "test_crf.py")]
    done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    if not report.exists():
        raise AssertionError(f"pytest did not run {folder / 'test_crf.py'}:\n{done.stdout}\n{done.stderr}")
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname').rsplit('.', 1)[-1]}::{case.get('name')}"
        bad = [child for child in case if child.tag in ("failure", "error", "skipped")]
        message = "\n".join(f"{c.tag}: {c.get('message', '')}\n{c.text or ''}" for c in bad)
        outcomes[name] = Outcome(not bad, message)
    return outcomes


def test_pytorch_crf_suite_fails_only_where_documented(request, tmp_path):
    pytest.importorskip("torchcrf")
    installed = metadata.version("pytorch-crf")
    if installed != VERSION:
        pytest.skip(f"pytorch-crf {installed} is installed; the baseline run needs {VERSION}")
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    source = _upstream_tests(None if cache is None else cache.mkdir("pytorch-crf-v" + VERSION))
    assert source.count(THEIR_IMPORT + "\n") == 1, f"{THEIR_IMPORT!r} is not one line of the file"
    theirs = _run(source, tmp_path / "torchcrf")
    ours = _run(source.replace(THEIR_IMPORT + "\n", OUR_IMPORT + "\n"), tmp_path / "semiring_ops")

    assert set(ours) == set(theirs) and len(theirs) >= 20, (sorted(theirs), sorted(ours))
    assert set(EXPECTED_DIFFERENCES) <= set(theirs), set(EXPECTED_DIFFERENCES) - set(theirs)
    theirs_failed = {name for name, o in theirs.items() if not o.passed}
    ours_failed = {name for name, o in ours.items() if not o.passed}
    assert not theirs_failed & set(EXPECTED_DIFFERENCES), (
        "pytorch-crf itself fails tests listed as our differences",
        {name: theirs[name].message for name in theirs_failed & set(EXPECTED_DIFFERENCES)},
    )
    unexpected = ours_failed - theirs_failed - set(EXPECTED_DIFFERENCES)
    assert not unexpected, {name: ours[name].message for name in sorted(unexpected)}
    now_passing = set(EXPECTED_DIFFERENCES) - ours_failed
    assert not now_passing, f"these pass now: remove them from EXPECTED_DIFFERENCES and the docs: {now_passing}"
    for name, difference in EXPECTED_DIFFERENCES.items():
        assert re.search(difference.failure, ours[name].message), (name, difference.reason, ours[name].message)
    for name in theirs_failed:  # the environment's failures: ours fails the same way, not for a reason of its own
        want = theirs[name].message.splitlines()[0]
        assert not ours[name].passed and ours[name].message.splitlines()[0] == want, (name, want, ours[name].message)
    passed = sorted(name for name, o in ours.items() if o.passed)
    print(f"pytorch-crf v{VERSION}'s suite with LinearChainCRF: {len(passed)} passed, {len(ours_failed)} failed")
    for name in sorted(ours_failed):
        why = EXPECTED_DIFFERENCES[name].reason if name in EXPECTED_DIFFERENCES else "fails with pytorch-crf too"
        print(f"  {name}: {why}")


def test_a_copy_that_is_not_v0_7_2_is_refused(tmp_path, monkeypatch):
    """The harness runs only the file whose hash it knows: a changed copy is an error, not a skip."""
    copy = tmp_path / "test_crf.py"
    copy.write_text(f"{THEIR_IMPORT}\n\ndef test_nothing():\n    pass\n")
    monkeypatch.setenv(LOCAL_COPY, str(copy))
    with pytest.raises(AssertionError, match="SHA-256"):
        _upstream_tests(None)


@pytest.mark.parametrize("required", [False, True])
def test_no_network_skips_or_fails_as_asked(tmp_path, monkeypatch, required):
    """Nothing listening at the address: two tries, then a skip naming the URL and the way to run it offline, or
    with SEMIRING_OPS_REQUIRE_PYTORCH_CRF_SUITE=1 a failure."""
    monkeypatch.delenv(LOCAL_COPY, raising=False)
    monkeypatch.setenv(REQUIRE, "1" if required else "0")
    monkeypatch.setattr(sys.modules[__name__], "URL", "http://127.0.0.1:9/test_crf.py")
    monkeypatch.setattr(time, "sleep", lambda _: None)
    outcome = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(outcome, match=f"127.0.0.1:9/test_crf.py.*{LOCAL_COPY}"):
        _upstream_tests(tmp_path)
