"""Shared fixtures: devices, kernel implementations, output poisoning, hypothesis profiles."""

from __future__ import annotations

import os
import random

import pytest
import torch
from hypothesis import HealthCheck, settings

from semiring_ops.build import backends
from semiring_ops.lazy import dispatch as lazy_dispatch
from semiring_ops.lazy.plan import set_poison_outputs as set_lazy_poison_outputs

# torch-semiring-einsum's own test files, run by tests/test_semiring_einsum_suite.py with their import rewritten
collect_ignore = ["semiring_einsum_suite"]

settings.register_profile(
    "default",
    max_examples=int(os.environ.get("SEMIRING_OPS_TEST_EXAMPLES", 30)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("default")

HAS_CUDA = torch.cuda.is_available()
CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU")])
DEVICES = ["cpu", CUDA]


@pytest.fixture
def needs_clusters():
    """Skips without a GPU that has thread block clusters (compute capability 9.0+)."""
    if not HAS_CUDA:
        pytest.skip("no CUDA GPU")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread block clusters need compute capability 9.0")


def assert_ctc_loss_matches(lp, targets, input_lengths, target_lengths, tol: float) -> None:
    """semiring_ops.ctc_loss (unreduced, zero_infinity) and its gradient against the CTC structure's PyTorch program
    in float64, and the loss against torch's ctc_loss in float64 (its gradient is taken as if through a
    log_softmax: not compared)."""
    from semiring_ops import ctc_loss
    from semiring_ops.structures.fused import generic_only

    args = (targets, input_lengths, target_lengths)
    x = lp.clone().requires_grad_()
    loss = ctc_loss(x, *args, reduction="none", zero_infinity=True)
    (g,) = torch.autograd.grad(loss.sum(), x)
    with generic_only():
        y = lp.double().requires_grad_()
        want = ctc_loss(y, *args, reduction="none", zero_infinity=True)
        (gw,) = torch.autograd.grad(want.sum(), y)
    theirs = torch.nn.functional.ctc_loss(lp.double(), *args, reduction="none", zero_infinity=True)
    for got, expected in ((loss, want), (loss, theirs), (g, gw)):
        torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(params=["kernel", "reference"])
def impl(request, device):
    """Runs a test on the compiled kernels and again on the blocked PyTorch reference backend."""
    dev = torch.device(device)
    if request.param == "kernel":
        be = backends.backend_for(dev)
        if be.kind == "reference" and os.environ.get("SEMIRING_OPS_BACKEND") != "reference":
            pytest.fail(f"compiled {device} kernels unavailable: {be.detail}")
        yield "kernel"
        return
    saved = backends.loaded_backends().get(dev.type)
    backends._backends[dev.type] = backends.reference_backend(dev.type, "forced by test")
    try:
        yield "reference"
    finally:
        if saved is None:
            backends._backends.pop(dev.type, None)
        else:
            backends._backends[dev.type] = saved


@pytest.fixture(autouse=True)
def poison_outputs():
    """Compiled kernels (semiring ops and lazy reductions) allocate their outputs filled with NaN (and -1
    for indices) during tests, so an element a kernel forgets to write shows up as a mismatch."""
    backends.set_poison_outputs(True)
    set_lazy_poison_outputs(True)  # the lazy reductions' kernels too
    yield
    backends.set_poison_outputs(False)
    set_lazy_poison_outputs(False)


def _lazy_backend(monkeypatch, kind: str) -> None:
    monkeypatch.setattr(lazy_dispatch, "_choice", {"cpu": (kind, "test"), "cuda": (kind, "test")})


@pytest.fixture(params=["compiled", "torch"])
def backend(request, monkeypatch) -> str:
    """Lazy reductions: runs a test on the generated kernels (C++ / CUDA), then on the PyTorch fallback."""
    _lazy_backend(monkeypatch, request.param)
    return request.param


@pytest.fixture
def compiled(monkeypatch) -> None:
    """Lazy reductions: the generated kernels only, never the PyTorch fallback."""
    _lazy_backend(monkeypatch, "compiled")


def _threads_per_worker() -> int | None:
    """The CPU threads an xdist worker gets: the machine's cores shared among the workers (at least 1), or None
    outside xdist or where OMP_NUM_THREADS says already. Two workers of torch's default thread count on two cores
    run four OpenMP threads on two cores; each parallel region's barrier then waits for descheduled threads, and
    the suite took ~1.5x its CPU time (a 2-core run of four CPU-bound files: 222 s, 151 s with a thread each).
    tests/test_cpu_threads.py runs every CPU kernel family on several threads against one."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    return max(1, (os.cpu_count() or 1) // workers)


_saved_threads: list[int] = []


def pytest_configure(config):
    threads = _threads_per_worker()
    if threads is not None:
        _saved_threads.append(torch.get_num_threads())
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the subprocesses tests start (peers' suites and examples)


def pytest_unconfigure(config):
    if _saved_threads:
        torch.set_num_threads(_saved_threads.pop())
        os.environ.pop("OMP_NUM_THREADS", None)


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle",
        type=int,
        default=None,
        metavar="SEED",
        help="run the tests in an order shuffled by SEED (every xdist worker draws the same), so that a test which "
        "depends on what ran before it shows",
    )


def pytest_collection_modifyitems(config, items):
    """``--shuffle SEED``: the collected tests in a shuffled order. Tests marked ``extended`` (a peer's scripts run
    on the peer too, tutorials of a minute, compiles of dozens of kernels) are skipped unless
    SEMIRING_OPS_EXTENDED_TESTS=1 or the -m expression names them."""
    seed = config.getoption("--shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)
    if os.environ.get("SEMIRING_OPS_EXTENDED_TESTS") == "1" or "extended" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="extended test: SEMIRING_OPS_EXTENDED_TESTS=1 (or -m extended) runs it")
    for item in items:
        if "extended" in item.keywords:
            item.add_marker(skip)


_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Each test file's time (setup, call and teardown of its tests), for the summary below; with xdist the reports
    reach the controlling process, so it sums every worker's."""
    path = report.nodeid.split("::")[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The slowest test files: where CI's time goes (its limit is 30 minutes, README's test command included)."""
    if not _file_seconds:
        return
    total = sum(_file_seconds.values())
    terminalreporter.section("slowest test files")
    for path, seconds in sorted(_file_seconds.items(), key=lambda kv: -kv[1])[:30]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {100 * seconds / total:4.1f}%  {path}")
    terminalreporter.write_line(f"{total:8.1f} s  in {len(_file_seconds)} files (the sum over workers)")


def counted_calls(monkeypatch, module, name: str, calls: dict | None = None) -> dict:
    """module.name replaced by a wrapper counting its calls (in the returned dict's "n"; into ``calls``'s if
    given, so that two functions share a count)."""
    calls = {"n": 0} if calls is None else calls
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def nvrtc_compiles(source: str, target: str, key: str) -> bytes:
    """``source`` compiled by the runtime's own compiler (libnvrtc, no GPU needed) to a cubin for ``target`` (sm_90 or
    sm_90a), as the lazy kernels compile; the test skips where libnvrtc is missing or does not target sm_90."""
    from semiring_ops.build.jit import source_root
    from semiring_ops.lazy import nvrtc

    try:
        nv = nvrtc._nvrtc()
    except OSError as exc:
        pytest.skip(f"libnvrtc not found: {exc}")
    if nv.supported_archs is not None and 90 not in nv.supported_archs:
        pytest.skip(f"this NVRTC does not target sm_90 ({nv.supported_archs})")
    options = (f"--gpu-architecture={target}", "-std=c++17", "-default-device", f"--include-path={source_root()}")
    return nvrtc._nvrtc_compile(source, options, True, key)
