#!/usr/bin/env bash
# A CUDA toolkit in the layout NVIDIA's pip wheels install (SITE/nvidia/cu13: nvcc, nvidia-nvvm, nvidia-cuda-crt,
# nvidia-cuda-cccl, nvidia-cuda-runtime), made of a system toolkit's files, for testing the no-system-toolkit path
# on a machine that cannot download those wheels (the lent GPU machine reaches no registry).
# The binaries are copied, not linked: nvcc reads nvcc.profile beside its real location, and that file here is the
# wheel's (TOP = its folder's parent), so the copy compiles with this tree alone.
# Usage: bash benchmarks/pip_toolkit_from_system.sh SITE [SYSTEM_TOOLKIT=/usr/local/cuda]
set -euo pipefail
site=$1
src=$(readlink -f "${2:-/usr/local/cuda}")
dst=$site/nvidia/cu13
rm -rf "$dst"
mkdir -p "$dst/bin" "$dst/nvvm/bin" "$dst/lib" "$dst/include"
for tool in nvcc ptxas fatbinary nvlink cudafe++ bin2c; do cp "$src/bin/$tool" "$dst/bin/"; done
[ -d "$src/bin/crt" ] && cp -r "$src/bin/crt" "$dst/bin/"
cat > "$dst/bin/nvcc.profile" <<'EOF'

TOP              = $(_HERE_)/..

CICC_PATH        = $(TOP)/nvvm/bin
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice

LD_LIBRARY_PATH += $(TOP)/lib:
PATH            += $(CICC_PATH):$(_HERE_):

INCLUDES        +=  "-I$(TOP)/$(_TARGET_DIR_)/include" $(_SPACE_)
SYSTEM_INCLUDES +=  "-isystem" "$(TOP)/$(_TARGET_DIR_)/include/cccl" $(_SPACE_)

LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)/stubs" "-L$(TOP)/$(_TARGET_DIR_)/lib$(_TARGET_SIZE_)"

CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
EOF
cp "$src/nvvm/bin/cicc" "$dst/nvvm/bin/"
cp -r "$src/nvvm/libdevice" "$dst/nvvm/"
# headers: the runtime's, crt and cccl (the system toolkit keeps cccl beside the others; the wheel under include/cccl)
inc=$(readlink -f "$src/include")
cp -r "$inc/." "$dst/include/"
cp -P "$src"/lib64/libcudart.so.* "$dst/lib/" 2>/dev/null || cp -P "$src"/targets/*/lib/libcudart.so.* "$dst/lib/"
echo "pip-layout toolkit: $dst ($(du -sh "$dst" | cut -f1))"
