"""CI: the wheel a user installs, built and tried as they would.

1. `python -m build` gives the sdist and, from it, the wheel, with SEMIRING_OPS_BUILD_EXT=1: every CPU kernel family
   and, when torch is a CUDA build, every CUDA one (sm_90: CI's one CUDA compile; it has no GPU to run them).
   The wheel's families are built as on first use, into $SEMIRING_OPS_CACHE when it is set: in CI, the cache the
   README's commands filled, built for the wheel's CPU target (.ci/run), so the CPU families are taken from there
   and CI compiles them once. The CUDA kernels compile with NVIDIA's pip toolkit, the `cuda13` extra installed
   beside the CUDA torch, with PATH and CUDA_HOME free of any system toolkit (and SEMIRING_OPS_CUDA_TOOLKIT=pip:
   /usr/local/cuda is not looked at).
2. The wheel goes into a fresh venv whose PATH has no compiler at all. A smoke set runs (semiring matmul, the CRF,
   the HMM, a structure, the block engine's writer) with nothing compiled (the cache stays empty), `info` says
   prebuilt for every family, and the CUDA modules load.
3. The manifest changed to another torch: one line says why the prebuilt kernels are not loaded, each family then
   falls back (no compiler) with the one warning naming the fix, the answers stay right, nothing crashes.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
WITH_CUDA = torch.version.cuda is not None and os.environ.get("SEMIRING_OPS_BUILD_CUDA", "1") == "1"


def run(cmd, env=None, cwd=None, what=""):
    t0 = time.time()
    res = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout[-20000:], res.stderr[-20000:], sep="\n")
        sys.exit(f"{what or cmd[0]} failed (exit {res.returncode})")
    print(f"{what}: {time.time() - t0:.0f} s", flush=True)
    return res


def no_toolkit_env(**extra):
    """This venv's and the system's binaries, no CUDA toolkit among them, no CUDA_HOME."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "SEMIRING_OPS_BACKEND")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    if shutil.which("nvcc", path=env["PATH"]):
        sys.exit(f"nvcc is on {env['PATH']}: this check needs a PATH without a CUDA toolkit")
    return {**env, **extra}


work = Path(tempfile.mkdtemp(prefix="semiring_ops_wheel_"))
pip = [sys.executable, "-m", "pip", "install", "-q"]
run([*pip, "build", "wheel"], what="pip install build wheel")
build_cache = os.environ.get("SEMIRING_OPS_CACHE") or str(work / "build-cache")
build_env = no_toolkit_env(
    SEMIRING_OPS_BUILD_EXT="1", SEMIRING_OPS_CACHE=build_cache, MAX_JOBS=os.environ.get("MAX_JOBS", "2")
)
if WITH_CUDA:
    run([*pip, "-e", f"{REPO}[cuda13]"], what="pip install -e '.[cuda13]' (NVIDIA's compiler as wheels)")
    build_env.update(SEMIRING_OPS_CUDA_TOOLKIT="pip", TORCH_CUDA_ARCH_LIST="9.0")
    found = run(
        [
            sys.executable,
            "-c",
            "from semiring_ops.build import toolkit, jit; print(toolkit.find_cuda_toolkit(jit.cache_root()))",
        ],
        env=build_env,
        what="toolkit",
    ).stdout.strip()
    print(found)
    assert "pip (nvidia-cuda-nvcc" in found, found
else:
    build_env["SEMIRING_OPS_BUILD_CUDA"] = "0"
    print("torch has no CUDA: CPU kernels only")

dist = work / "dist"
res = run(
    [sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, REPO], env=build_env, what="python -m build"
)
print("\n".join(line for line in res.stdout.splitlines() if line.startswith(("  cpu", "  cuda", "semiring_ops:"))))
sdist, wheel = next(dist.glob("*.tar.gz")), next(dist.glob("*.whl"))
names = zipfile.ZipFile(wheel).namelist()
built = sorted(n.split("/")[-1].removesuffix(".so") for n in names if n.startswith("semiring_ops/_prebuilt/"))
print(f"{sdist.name}, {wheel.name}: {built}")
expected = {f"semiring_ops_cpu_{f}" for f in ("bmm", "chain", "span", "host_writers", "hmm", "ctc")}
expected |= {"semiring_ops_cpu_bmm_autograd", "semiring_ops_cpu_chain_autograd"}  # the CPU families' autograd nodes
if WITH_CUDA:
    expected |= {f"semiring_ops_cuda_{f}" for f in ("bmm", "chain", "span", "fast_log", "packed", "ctc")}
assert set(built) == expected, built
assert "semiring_ops/_prebuilt.json" in names and "semiring_ops/csrc/ops.h" in names

# a fresh venv with the wheel; torch and numpy seen from CI's venv (a .pth line; its editable semiring_ops is not)
venv = work / "venv"
run([sys.executable, "-m", "venv", venv], what="fresh venv")
fresh_python = venv / "bin" / "python"
fresh_site = Path(
    subprocess.run(
        [fresh_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
)
(fresh_site / "ci_torch.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
run([fresh_python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], what="pip install the wheel")
cache = work / "user-cache"
user_env = {"PATH": str(venv / "bin"), "HOME": str(work), "SEMIRING_OPS_CACHE": str(cache), "LANG": "C.UTF-8"}
SMOKE = textwrap.dedent(
    """
    import shutil, warnings, torch, semiring_ops as so
    from semiring_ops import blocks, lazy
    from semiring_ops.structures import DependencyTree
    from semiring_ops.build.backends import backend_for
    from semiring_ops.info import kernel_summary
    assert not any(shutil.which(c) for c in ("c++", "g++", "gcc", "cc", "clang", "nvcc")), "a compiler is on PATH"
    assert so.__file__.startswith("{site}"), so.__file__
    torch.manual_seed(0)
    a, b = torch.randn(2, 5, 7, requires_grad=True), torch.randn(2, 7, 3)
    out = so.logbmm(a, b)
    assert torch.allclose(out, torch.logsumexp(a[..., None] + b[:, None], -2), atol=1e-5)
    out.sum().backward()
    assert torch.equal(so.maxbmm(a, b), (a[..., None] + b[:, None]).amax(-2))
    crf = so.LinearChainCRF(4, batch_first=True)
    em, tags = torch.randn(3, 6, 4, requires_grad=True), torch.randint(0, 4, (3, 6))
    (-crf(em, tags)).backward()
    assert len(crf.decode(em)) == 3
    hmm = so.HMM(2, emission="categorical", n_symbols=3)
    hmm.fit(torch.randint(0, 3, (200,)).numpy(), n_iter=3)
    lp = torch.randn(8, 2, 5).log_softmax(-1).requires_grad_()
    so.ctc_loss(lp, torch.tensor([[1, 2], [3, 3]]), [8, 7], [2, 2]).backward()
    assert so.forced_align(lp.detach().transpose(0, 1), torch.tensor([[1, 2], [3, 4]]))[0].shape == (2, 8)
    arcs = torch.randn(2, 6, 6, dtype=torch.float64)
    assert torch.isfinite(DependencyTree().partition(arcs, lengths=torch.tensor([6, 4]))).all()
    x = torch.randn(300, 2)
    K = (-((lazy.Vi(x) - lazy.Vj(x)) ** 2).sum(-1)).exp()
    dense = blocks.dense(K, devices=["cpu"], max_device_bytes=64_000, progress=False)
    assert torch.allclose(dense[..., 0] if dense.dim() == 3 else dense, K.dense()[..., 0], atol=1e-5)
    print("KINDS", kernel_summary())
    """
)
smoke = SMOKE.format(site=fresh_site)
res = run([fresh_python, "-W", "error::RuntimeWarning", "-c", smoke], env=user_env, cwd=work, what="smoke set")
print(res.stdout.strip())
kinds = res.stdout.split("KINDS", 1)[1]
cpu_modules = sum(m.startswith("semiring_ops_cpu_") for m in expected)  # the smoke set uses every CPU family and module
assert kinds.count("prebuilt") == cpu_modules and "compiled" not in kinds and "reference" not in kinds, kinds
assert not list(cache.glob("semiring_ops_*")), "the prebuilt wheel compiled something"
info = run([fresh_python, "-m", "semiring_ops", "info", "--json"], env=user_env, cwd=work, what="info").stdout
families = [f for f in json.loads(info)["families"] if WITH_CUDA or f["device"] == "cpu"]
assert all(f["kind"] == "prebuilt" for f in families), [(f["device"], f["family"], f["kind"]) for f in families]
if WITH_CUDA:
    load = (
        "from semiring_ops.build import families, prebuilt; [prebuilt.load_prebuilt(f).semiring_ids() for f in "
        "families.families_for('cuda')]; print('CUDA modules load')"
    )
    print(run([fresh_python, "-c", load], env=user_env, cwd=work, what="CUDA modules").stdout.strip())

# the manifest of another torch: refused before loading, one line, then the no-compiler fallback
manifest = fresh_site / "semiring_ops" / "_prebuilt.json"
record = json.loads(manifest.read_text())
manifest.write_text(json.dumps({**record, "torch": "0.0.0"}))
lite = (
    "import torch, semiring_ops as so; a, b = torch.randn(2, 5, 7), torch.randn(2, 7, 3); "
    "assert torch.allclose(so.logbmm(a, b), torch.logsumexp(a[..., None] + b[:, None], -2), atol=1e-5); "
    "crf = so.LinearChainCRF(4); crf(torch.randn(6, 3, 4), torch.randint(0, 4, (6, 3))); print('ok')"
)
res = run([fresh_python, "-c", lite], env=user_env, cwd=work, what="another torch's manifest")
err = res.stderr
assert res.stdout.strip() == "ok", res.stdout
assert err.count("semiring_ops: not loading the prebuilt kernels: they were built for torch 0.0.0") == 1, err
assert err.count("no C++ compiler") == 1 and "Traceback" not in err, err
print("the mismatched wheel: one line, one warning, right answers")
shutil.rmtree(work, ignore_errors=True)
