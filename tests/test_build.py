"""Building and loading: concurrent first builds share one good cache, cached loads compile nothing,
a missing compiler falls back to the reference with one warning, and `info` reports what is active."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import warnings, torch, semiring_ops as so
    from semiring_ops.build.backends import backend_for
    torch.manual_seed(0)
    a, b = torch.randn(3, 20, 30), torch.randn(3, 30, 10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = so.logbmm(a, b)
        out2 = so.maxbmm(a, b)
    ref = torch.logsumexp(a[..., :, :, None] + b[..., None, :, :], -2)
    assert torch.allclose(out, ref, atol=1e-5), "wrong numbers"
    print("KIND", backend_for(torch.device("cpu")).kind)
    print("WARNINGS", sum("reference implementation" in str(w.message) for w in caught))
    """
)


def _run(env_extra: dict[str, str], timeout: int = 900) -> subprocess.Popen:
    env = {**os.environ, **env_extra}
    env.pop("SEMIRING_OPS_BACKEND", None)
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return out, err


@pytest.mark.slow
def test_two_processes_building_at_once_both_succeed_and_leave_a_good_cache(tmp_path):
    env = {"SEMIRING_OPS_CACHE": str(tmp_path)}
    first, second = _run(env), _run(env)
    results = [_finish(first), _finish(second)]
    for out, _ in results:
        assert "KIND compiled" in out
    messages = [err.count("semiring_ops: compiling the CPU kernels") for _, err in results]
    assert sorted(messages) == [0, 1], f"exactly one process compiles: {messages}"
    assert any(str(tmp_path) in err for _, err in results), "the message names the cache folder"
    out, err = _finish(_run(env))  # a later process loads from the cache without compiling
    assert "KIND compiled" in out and "compiling" not in err
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(folders) == 1 and (folders[0] / "build.ok").is_file()


def test_no_compiler_falls_back_to_the_reference_with_one_warning(tmp_path):
    env = {"SEMIRING_OPS_CACHE": str(tmp_path), "CXX": str(tmp_path / "no-such-compiler")}
    out, _err = _finish(_run(env))
    assert "KIND reference" in out
    assert "WARNINGS 1" in out


def test_info_command_reports_backends_and_cache():
    res = subprocess.run([sys.executable, "-m", "semiring_ops", "info"], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    assert "build cache:" in res.stdout
    assert "cpu" in res.stdout and "log matmul" in res.stdout
    assert "std matmul   torch.matmul" in res.stdout
    assert "lazy kernel cache:" in res.stdout
    assert "lazy reductions cpu: compiled (g++)" in res.stdout  # CI and this machine have g++
