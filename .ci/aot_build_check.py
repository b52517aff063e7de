"""CI: the ahead-of-time build documented in docs/build.md works, and the CUDA sources compile.

Installs this checkout with SEMIRING_OPS_BUILD_EXT=1 into a temporary folder, then imports it from
there and checks the prebuilt CPU module serves the CPU ops. When nvcc and a CUDA build of torch are
present, the CUDA extension is part of that build (for sm_90; compile only, no GPU needed), so a CUDA
source that does not compile fails CI here.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
env = {**os.environ, "SEMIRING_OPS_BUILD_EXT": "1", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
with_cuda = shutil.which("nvcc") is not None and torch.version.cuda is not None
if with_cuda:
    env["TORCH_CUDA_ARCH_LIST"] = "9.0"
    # torch infers CUDA_HOME from `which nvcc`; where nvcc is a wrapper in /usr/local/bin that guess
    # is /usr/local, which has no lib64/libcudart. Point it at the toolkit when it is in the usual place.
    if "CUDA_HOME" not in env and os.path.isdir("/usr/local/cuda/lib64"):
        env["CUDA_HOME"] = "/usr/local/cuda"
else:
    env["SEMIRING_OPS_BUILD_CUDA"] = "0"
    print("nvcc or a CUDA build of torch missing: CPU extension only")

target = tempfile.mkdtemp(prefix="semiring_ops_aot_")
t0 = time.time()
cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", target, repo]
res = subprocess.run(cmd, env=env, capture_output=True, text=True)
if res.returncode != 0:
    print(res.stdout[-20000:], res.stderr[-20000:], sep="\n")
    sys.exit(f"ahead-of-time build failed (exit {res.returncode})")
built = sorted(f for f in os.listdir(os.path.join(target, "semiring_ops")) if f.startswith("_C_"))
print(f"built in {time.time() - t0:.0f} s: {built}")
if with_cuda and not any(f.startswith("_C_cuda") for f in built):
    sys.exit("the CUDA extension was not built")

check = (
    "import torch, semiring_ops as so; from semiring_ops.build.backends import backend_for;"
    "be = backend_for(torch.device('cpu')); assert be.kind == 'prebuilt', (be.kind, be.detail);"
    "a, b = torch.randn(2, 5, 7), torch.randn(2, 7, 3);"
    "assert torch.allclose(so.logbmm(a, b), torch.logsumexp(a[..., None] + b[:, None], -2), atol=1e-5);"
    "print('prebuilt CPU kernels serve the CPU ops')"
)
if with_cuda:
    check += (
        ";import semiring_ops._C_cuda as m; assert m.semiring_ids()['LogSemiring'] == 0; print('CUDA module loads')"
    )
run_env = {k: v for k, v in os.environ.items() if k != "SEMIRING_OPS_BACKEND"}
run_env["PYTHONPATH"] = target
res = subprocess.run([sys.executable, "-c", check], env=run_env, cwd=tempfile.gettempdir(), text=True)
sys.exit(res.returncode)
