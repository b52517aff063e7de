#!/usr/bin/env bash
# Runs a command with pykeops 2.3 pointed at CUDA 12.9's NVRTC and runtime headers, on a machine whose toolkit is
# CUDA 13: pykeops 2.3 segfaults at its first GPU reduction with CUDA 13's NVRTC (../shared/ANCHORS.md). It is how
# docs/benchmarks.md's issue-42 tables put KeOps beside ours in one run:
#
#   pip install --target /tmp/cu12 "nvidia-cuda-nvrtc-cu12==12.9.*" "nvidia-cuda-runtime-cu12==12.9.*"
#   sudo CU12=/tmp/cu12 bash benchmarks/keops_cuda12.sh python benchmarks/lazy_dims.py --device cuda --pykeops
#
# CU12: a folder in pip's layout (nvidia/cuda_nvrtc/{lib,include}, nvidia/cuda_runtime/{lib,include}). pykeops
# finds NVRTC with ldconfig and the toolkit at /usr/local/cuda, so for the command's duration this registers CU12's
# libraries with ldconfig and moves /usr/local/cuda aside (hence root), and restores both on exit. The home it
# builds for CUDA_PATH holds CUDA 12.9's headers, the crt/ host headers the runtime wheel lacks (this repository's
# csrc/nvrtc_host/crt) and, from the CUDA 13 toolkit if present, libcu++'s nv/ and cuda/ folders.
set -euo pipefail
: "${CU12:?CU12=<folder with nvidia-cuda-nvrtc-cu12 and nvidia-cuda-runtime-cu12 12.9 installed by pip --target>}"
[ $# -gt 0 ] || { echo "usage: CU12=<folder> bash $0 <command...>" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
home=$(mktemp -d /tmp/keops_cuda12.XXXXXX)
mkdir -p "$home/lib64" "$home/include"
cp -P "$CU12"/nvidia/cuda_nvrtc/lib/libnvrtc* "$CU12"/nvidia/cuda_runtime/lib/libcudart* "$home/lib64/"
cp -r "$CU12"/nvidia/cuda_runtime/include/. "$CU12"/nvidia/cuda_nvrtc/include/. "$home/include/"
cp -r "$repo/csrc/nvrtc_host/crt" "$home/include/"
for d in nv cuda; do [ -d "/usr/local/cuda/include/$d" ] && cp -r "/usr/local/cuda/include/$d" "$home/include/"; done
ln -sf libnvrtc.so.12 "$home/lib64/libnvrtc.so"
ln -sf libcudart.so.12 "$home/lib64/libcudart.so"
hidden=()
restore() {
  rm -f /etc/ld.so.conf.d/zz-keops-cuda12.conf
  for d in "${hidden[@]}"; do mv "$d.keops-hidden" "$d"; done
  ldconfig
  rm -rf "$home"
}
trap restore EXIT
for d in /usr/local/cuda "$(readlink -f /usr/local/cuda 2>/dev/null || true)"; do
  if [ -n "$d" ] && [ -e "$d" ] && [ ! -e "$d.keops-hidden" ]; then mv "$d" "$d.keops-hidden"; hidden+=("$d"); fi
done
echo "$home/lib64" > /etc/ld.so.conf.d/zz-keops-cuda12.conf
ldconfig
export CUDA_PATH=$home CUDA_HOME=$home LD_LIBRARY_PATH=$home/lib64:${LD_LIBRARY_PATH:-}
PATH=$(echo "$PATH" | tr ':' '\n' | grep -v cuda | paste -sd:)
export PATH
"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 143' TERM INT
wait "$child"
