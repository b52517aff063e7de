"""Compile-only check of the CUDA extension for sm_90 (no GPU needed): fails CI if it does not build."""

import os
import sys
import tempfile
import time

os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
# torch infers CUDA_HOME from `which nvcc`; where nvcc is a wrapper in /usr/local/bin that guess is
# /usr/local, which has no lib64/libcudart. Point it at the toolkit when it is in the usual place.
if "CUDA_HOME" not in os.environ and os.path.isdir("/usr/local/cuda/lib64"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"
os.environ.setdefault("MAX_JOBS", "2")
os.environ["SEMIRING_OPS_CACHE"] = tempfile.mkdtemp(prefix="semiring_ops_cuda_ci_")

from semiring_ops.build import jit  # noqa: E402

t0 = time.time()
try:
    module = jit.load(jit.CUDA_EXTENSION)
except Exception as exc:  # noqa: BLE001
    print(f"CUDA extension failed to build: {exc}", file=sys.stderr)
    sys.exit(1)
print(f"CUDA extension built for sm_90 in {time.time() - t0:.0f} s: {module.__file__}")
