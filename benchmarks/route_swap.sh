#!/usr/bin/env bash
# The log forward (SemiringBmmPolicy<LogSemiring, float, false>) built four ways and launched by the NVRTC route, its
# cache file rewritten to hold each build's cubin (nvrtc_kernels._pack, the same lowered name), beside the nvcc
# route's own: which of the front end's PTX, ptxas or the route's launch makes a difference between the routes
# (docs/perf_notes.md, "The NVRTC route's kernels"). Then ncu on the kernel under each route. Needs a GPU, nvcc,
# ptxas, cuobjdump and ncu (sm_90 as written).
# Usage (repo root, installed or on PYTHONPATH): OUT=/tmp/out bash benchmarks/route_swap.sh
set -u
export SEMIRING_OPS_CACHE=${SEMIRING_OPS_CACHE:-/tmp/so_cache} PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/route_swap}
mkdir -p "$OUT"; rm -rf /tmp/nvrtc_orig /tmp/nvrtc_nvcc /tmp/nvrtc_nvcc_ptxas /tmp/nvrtc_nvrtc_ptxas /tmp/ptx_cache
TI=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")/include
F="-O3 -lineinfo -std=c++17 --expt-relaxed-constexpr -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ -Icsrc -isystem $TI"
nvcc -cubin -arch=sm_90 $F csrc/cuda/bmm_kernels.cu -o /tmp/nvcc_bmm.cubin &
nvcc -ptx -arch=sm_90 $F csrc/cuda/bmm_kernels.cu -o /tmp/nvcc_bmm.ptx &
SEMIRING_OPS_CUDA_KERNELS=nvrtc python3 -c "
import torch, semiring_ops as so
a = torch.randn(8, 1024, 1024, device='cuda', requires_grad=True); so.logbmm(a, a).sum().backward()" 2>&1 | tail -2
wait
ptxas -arch=sm_90 -O3 -lineinfo /tmp/nvcc_bmm.ptx -o /tmp/nvcc_ptxas.cubin
cp -r $SEMIRING_OPS_CACHE/nvrtc /tmp/nvrtc_orig
SEMIRING_OPS_CACHE=/tmp/ptx_cache SEMIRING_OPS_CUDA_KERNELS=nvrtc python3 -c "
import torch, semiring_ops as so
from semiring_ops.build import nvrtc_kernels
nvrtc_kernels._target = lambda: ('compute_90', False)
a = torch.randn(8, 1024, 1024, device='cuda'); so.logbmm(a, a); torch.cuda.synchronize()" 2>&1 | tail -1
python3 - <<'PY'
import glob, os, subprocess
from semiring_ops.build import nvrtc
from semiring_ops.build.nvrtc_kernels import _pack, _unpack
def find(pattern):
    for f in glob.glob(pattern):
        lowered, image = _unpack(open(f, "rb").read())
        if b"LogSemiringEfLb0" in lowered and b"SemiringBmmPolicy" in lowered:
            return f, lowered.decode(), image
target, name, image = find(os.environ["SEMIRING_OPS_CACHE"] + "/nvrtc/*.cubin")
_, _, ptx = find("/tmp/ptx_cache/nvrtc/*.ptx")
open("/tmp/nvrtc.ptx", "wb").write(ptx.rstrip(b"\0"))
subprocess.run(["ptxas", "-arch=sm_90", "-O3", "-lineinfo", "/tmp/nvrtc.ptx", "-o", "/tmp/nvrtc_ptxas.cubin"], check=True)
print("kernel", name, target, "nvrtc version", nvrtc.nvrtc_version())
open("/tmp/nvrtc_cubin_orig", "wb").write(image)
for variant, cub in (("nvcc", "/tmp/nvcc_bmm.cubin"), ("nvcc_ptxas", "/tmp/nvcc_ptxas.cubin"), ("nvrtc_ptxas", "/tmp/nvrtc_ptxas.cubin")):
    d = f"/tmp/nvrtc_{variant}"; subprocess.run(["cp", "-r", "/tmp/nvrtc_orig", d], check=True)
    p = os.path.join(d, os.path.basename(target)); os.chmod(p, 0o644)
    open(p, "wb").write(_pack(name, open(cub, "rb").read()))
PY
cuobjdump -sass /tmp/nvrtc_cubin_orig > $OUT/sass_nvrtc.txt 2>&1; cuobjdump -sass /tmp/nvcc_bmm.cubin > $OUT/sass_nvcc_all.txt 2>&1
cuobjdump -res-usage /tmp/nvrtc_cubin_orig 2>&1 | grep -A1 LogSemiringEfLb0 | head -4
T='import sys, torch, semiring_ops as so
sys.path.insert(0, "benchmarks")  # timing.py
from timing import time_ms
torch.manual_seed(0)
a = torch.randn(8, 1024, 1024, device="cuda"); b = torch.randn(8, 1024, 1024, device="cuda")
print(round(time_ms(lambda: so.logbmm(a, b), "cuda", 60), 4))'
for r in 1 2 3; do
  echo "nvcc-route $(SEMIRING_OPS_CUDA_KERNELS=nvcc python3 -c "$T" 2>/dev/null)"
  for v in orig nvcc nvcc_ptxas nvrtc_ptxas; do
    rm -rf $SEMIRING_OPS_CACHE/nvrtc; cp -r /tmp/nvrtc_$v $SEMIRING_OPS_CACHE/nvrtc
    echo "nvrtc-route cubin=$v $(SEMIRING_OPS_CUDA_KERNELS=nvrtc python3 -c "$T" 2>/dev/null)"
  done
done
rm -rf $SEMIRING_OPS_CACHE/nvrtc; cp -r /tmp/nvrtc_orig $SEMIRING_OPS_CACHE/nvrtc
P='import torch, semiring_ops as so
a = torch.randn(8, 1024, 1024, device="cuda"); b = torch.randn(8, 1024, 1024, device="cuda")
for _ in range(3): so.logbmm(a, b)
torch.cuda.synchronize()'
for route in nvcc nvrtc; do
  SEMIRING_OPS_CUDA_KERNELS=$route timeout 120 ncu -k regex:contraction_kernel -s 2 -c 1 --section SpeedOfLight \
    --section WarpStateStats --section InstructionStats --section SchedulerStats --section Occupancy --section LaunchStats \
    python3 -c "$P" > $OUT/ncu_$route.txt 2>&1
done
for route in nvcc nvrtc; do echo "== $route"; grep -E "Duration|Executed Ipc|Issued Instructions|Warp Cycles Per Issued|Achieved Occupancy|Registers|SM Frequency|Shared Memory Config|Block Limit|Driver Shared" $OUT/ncu_$route.txt | head -24; done
