#!/usr/bin/env bash
# The release wheel on a GPU machine: built with every kernel family for setup.py's default CUDA targets (sm_80,
# 86, 89, 90, 100, 120 + PTX, whatever TORCH_CUDA_ARCH_LIST the machine sets), installed into a fresh venv whose
# PATH holds no compiler, then `info`, a timed smoke set and the CUDA tests of the matmul, CRF and structures run
# against it, with nothing compiled.
# Usage (repo root, on the lent GPU): bash benchmarks/wheel_gpu_check.sh   (logs and the wheel's listing in $OUT)
#   WHEEL_ROUTE=nvrtc: a wheel of the NVRTC route (the CUDA host code alone; kernels compiled by NVRTC on their
#   first launch, into the fresh venv's empty cache: the first calls' times include those compiles)
set -uo pipefail
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
[ -x /usr/bin/g++ ] && export CC=/usr/bin/gcc CXX=/usr/bin/g++
OUT=${OUT:-/tmp/semiring_ops_out}
W=/tmp/wheel_gpu
rm -rf "$W" && mkdir -p "$W" "$OUT"
repo=$PWD
t0=$(date +%s)
# WHEEL_ARCHS: the CUDA targets (default: setup.py's, whatever TORCH_CUDA_ARCH_LIST the machine sets)
arch_env=(-u TORCH_CUDA_ARCH_LIST) && [ -n "${WHEEL_ARCHS:-}" ] && arch_env=("TORCH_CUDA_ARCH_LIST=$WHEEL_ARCHS")
env "${arch_env[@]}" SEMIRING_OPS_CUDA_KERNELS=${WHEEL_ROUTE:-auto} SEMIRING_OPS_BUILD_EXT=1 SEMIRING_OPS_CACHE=$W/build-cache python3 -m build --wheel --no-isolation --outdir "$W/dist" . \
  > "$OUT/wheel_build.log" 2>&1 || { tail -40 "$OUT/wheel_build.log"; exit 1; }
wheel=$(ls "$W"/dist/*.whl)
echo "wheel built in $(( $(date +%s) - t0 )) s: $(basename "$wheel") $(du -h "$wheel" | cut -f1)" | tee "$OUT/wheel_size.txt"
python3 -m zipfile -l "$wheel" | grep -E "_prebuilt" | tee "$OUT/wheel_listing.txt"

python3 -m venv "$W/venv"
site=$("$W/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$site/gpu_torch.pth"  # torch, pytest
# --ignore-installed: not the checkout that an editable install left in the image's site-packages
"$W/venv/bin/python" -m pip install -q --no-deps --no-index --ignore-installed "$wheel"
run() {  # in the fresh venv, a PATH with no compiler, an empty cache, outside the checkout
  (cd "$W" && env -i PATH="$W/venv/bin" HOME="$W" LANG=C.UTF-8 SEMIRING_OPS_CACHE="$W/user-cache" \
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 "$W/venv/bin/python" "$@")
}
run -m semiring_ops info | tee "$OUT/wheel_info.txt"
run - <<'EOF' 2>&1 | tee "$OUT/wheel_smoke.txt"
import shutil, time, torch, semiring_ops as so
from semiring_ops.info import kernel_summary
assert not any(shutil.which(c) for c in ("c++", "g++", "gcc", "nvcc")), "a compiler is on PATH"
print("semiring_ops from", so.__file__)
def timed(name, fn):
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter(); fn(); torch.cuda.synchronize()
    print(f"{name}: {1e3 * (time.perf_counter() - t0):.2f} ms")
t0 = time.perf_counter()
a = torch.randn(8, 1024, 1024, device="cuda", requires_grad=True)
b = torch.randn(8, 1024, 1024, device="cuda", requires_grad=True)
so.logbmm(a, b).sum().backward(); torch.cuda.synchronize()
print(f"first logbmm fwd+bwd, import excluded: {time.perf_counter() - t0:.2f} s (no module to compile)")
timed("logbmm fwd+bwd B=8 n=1024", lambda: so.logbmm(a, b).sum().backward())
timed("maxbmm fwd", lambda: so.maxbmm(a, b))
crf = so.LinearChainCRF(32, batch_first=True).cuda()
em = torch.randn(32, 128, 32, device="cuda", requires_grad=True)
tags = torch.randint(0, 32, (32, 128), device="cuda")
timed("CRF train step (32, 128, 32)", lambda: (-crf(em, tags)).backward())
timed("CRF decode", lambda: crf.decode(em))
print("KINDS", kernel_summary())
EOF
ls "$W/user-cache" 2>/dev/null | grep semiring_ops_ && echo "COMPILED SOMETHING" || echo "nothing compiled"
# first use from the wheel: import + the first call in a fresh process, each with an empty cache
run "$repo/benchmarks/first_use.py" --device cuda --no-build-all 2>&1 | tee "$OUT/wheel_first_use.txt"
# WHEEL_TESTS: the test files run against the wheel (default: matmul forward and backward, the CRF, the structures)
for f in ${WHEEL_TESTS:-test_bmm_forward test_bmm_backward test_crf_fused test_structures_fused}; do
  files="${files:-} $repo/tests/$f.py"
done
run -m pytest -q -p no:cacheprovider -m cuda -n 4 --dist loadfile $files 2>&1 | tail -5 | tee "$OUT/wheel_pytest.txt"
ls "$W/user-cache" 2>/dev/null | grep semiring_ops_ && echo "COMPILED SOMETHING" || echo "nothing compiled"
