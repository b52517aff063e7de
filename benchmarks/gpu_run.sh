#!/usr/bin/env bash
# One call on the lent GPU machine (the device tool): install, build the kernels, run every CUDA test,
# the compute-sanitizer stage and the benchmarks, keeping logs under $OUT.
# Usage (repo root): bash benchmarks/gpu_run.sh [pytest args]
#   STAGES="tests sanitize bench" (default all three; a call is limited to 10 minutes, so split them over
#   calls made back to back, e.g. STAGES=tests then STAGES=sanitize: the build cache in /tmp is reused);
#   STAGES=notoolkit: as a GPU user without a CUDA toolkit: the system toolkit hidden (nvcc off PATH, CUDA_HOME
#   unset, /usr/local/cuda renamed), NVIDIA's pip layout of the compiler made from its files
#   (pip_toolkit_from_system.sh: the machine reaches no registry for the wheels) on PYTHONPATH; first-use times
#   from cold caches (first_use.py), then the stages after it in the list run in that environment; the toolkit
#   is restored at the end. NVRTC_ONLY=1: no pip compiler either (the NVRTC route's user: torch's own packages only).
#   E.g. STAGES="notoolkit tests" PYTEST_ARGS="-n 4"; FIRST_USE=0 skips the cold first
#   uses (a second call on the warm machine). PYTEST_ARGS="--shuffle 7": the tests in a shuffled order (conftest.py).
#   SANITIZE_ARGS="--families bmm" narrows the sanitize stage;
#   BENCH="bmm crf ..." picks benchmarks; run the sanitize stage in every session that changes a kernel.
set -uo pipefail
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
# the GPU image's default CXX is a wrapper whose extensions crash on throwing; use the system compilers
[ -x /usr/bin/g++ ] && export CC=/usr/bin/gcc CXX=/usr/bin/g++
OUT=${OUT:-/tmp/semiring_ops_out}
mkdir -p "$OUT"
export SEMIRING_OPS_CACHE=${SEMIRING_OPS_CACHE:-/tmp/socache}
if ls .whl/*.whl >/dev/null 2>&1; then  # anchors carried as wheels (e.g. torch-semiring-einsum)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
# packages carried as folders (.whl/site/pykeops: KeOps's own test files, which tests/test_keops_suite.py reads)
[ -d .whl/site ] && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/.whl/site"
STAGES=${STAGES:-tests sanitize bench}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

hidden=""
if [[ " $STAGES " == *" notoolkit "* ]]; then
  system=$(readlink -f /usr/local/cuda)
  [ "${NVRTC_ONLY:-0}" = 1 ] || bash benchmarks/pip_toolkit_from_system.sh /tmp/pip_cuda "$system" | tee "$OUT/notoolkit.log"
  for d in /usr/local/cuda "$system"; do [ -e "$d" ] && mv "$d" "$d.hidden" && hidden="$d $hidden"; done
  restore() { for d in $hidden; do mv "$d.hidden" "$d"; done; }
  trap restore EXIT
  [ -e /usr/local/cuda ] && { echo "notoolkit: /usr/local/cuda could not be hidden; stopping"; exit 1; }
  PATH=$(echo "$PATH" | tr ':' '\n' | grep -v -e cuda -e '^/usr/local/bin$' | paste -sd:)
  export PATH
  unset CUDA_HOME CUDA_PATH
  [ "${NVRTC_ONLY:-0}" = 1 ] || export PYTHONPATH="/tmp/pip_cuda${PYTHONPATH:+:$PYTHONPATH}"
  { echo "nvcc on PATH: $(command -v nvcc || echo none); CUDA_HOME=${CUDA_HOME-unset}"; python3 -m semiring_ops info; } \
    2>&1 | tee -a "$OUT/notoolkit.log"
  # cold first uses, then every family built into the test cache from cold (first_use.py's 'build all');
  # FIRST_USE=0 skips them (a second call on the warm machine, its cache built)
  if [ "${FIRST_USE:-1}" = 1 ]; then
    rm -rf "$SEMIRING_OPS_CACHE"
    timeout 500 python3 benchmarks/first_use.py --json "$OUT/first_use.json" --build-into "$SEMIRING_OPS_CACHE" 2>&1 \
      | tee -a "$OUT/notoolkit.log"
  fi
fi
t0=$(date +%s)
python3 -m semiring_ops build 2>&1 | tee "$OUT/build.log"
echo "build took $(( $(date +%s) - t0 )) s"
if [[ " $STAGES " == *" tests "* ]]; then
  # the CUDA suite takes ~7 min serially: spread it over 6 workers where pytest-xdist is installed
  [ -z "${PYTEST_ARGS+x}" ] && python3 -c "import xdist" 2>/dev/null && PYTEST_ARGS="-n 6"
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest -m "${PYTEST_MARK:-cuda}" -q -p no:cacheprovider ${PYTEST_ARGS:-} "$@" 2>&1 \
    | tee "$OUT/pytest_cuda.log" | tail -40
fi
if [[ " $STAGES " == *" sanitize "* ]]; then  # every kernel family under memcheck, racecheck, synccheck, initcheck
  mkdir -p /tmp/sanitize_logs
  timeout 780 python3 benchmarks/sanitize.py --split --jobs 6 ${SANITIZE_ARGS:-} --out /tmp/sanitize_logs 2>&1 | tee "$OUT/sanitize.log"
  tar czf "$OUT/sanitize_logs.tgz" -C /tmp sanitize_logs  # one file per (tool, family): one archive back
fi
# BENCH: which benchmarks to run (default all; SKIP_BENCH=1 or a STAGES without bench for none)
[ "${SKIP_BENCH:-0}" = "1" ] && BENCH=""
[[ " $STAGES " == *" bench "* ]] || BENCH=""
for b in ${BENCH-bmm memory crf lazy lazy_example}; do
  case $b in
    bmm) timeout 300 python3 benchmarks/bmm.py --json "$OUT/bmm.json" 2>&1 | tee "$OUT/bmm.log" ;;
    memory) timeout 120 python3 benchmarks/memory.py 2>&1 | tee "$OUT/memory.log" ;;
    crf) timeout 360 python3 benchmarks/crf.py --json "$OUT/crf.json" 2>&1 | tee "$OUT/crf.log" ;;
    lazy) timeout 300 python3 benchmarks/lazy.py --out "$OUT/lazy.json" --out "$OUT/lazy.md" 2>&1 | tee "$OUT/lazy.log" ;;
    lazy_example) timeout 120 python3 examples/lazy_kernels.py 2>&1 | tee "$OUT/lazy_example.log" ;;
    einsum) timeout 420 python3 benchmarks/einsum.py ${EINSUM_ARGS:-} --out "$OUT/einsum.json" --out "$OUT/einsum.md" 2>&1 \
      | tee "$OUT/einsum.log" ;;
  esac
done
