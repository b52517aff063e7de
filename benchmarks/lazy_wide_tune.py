"""The chunked wide sums' constants (lazy/wide_chunks.py: j per tile, components per chunk, threads per block)
timed on an L1 k-NN and Laplace K @ b, 50,000^2 fp32, D = 128 and 784. One process per setting: the kernels are
memoised per process and the constants are read when a source is generated.

Usage:
    for c in "32 16 128" "32 32 128" "32 16 256" "16 16 128"; do python benchmarks/lazy_wide_tune.py $c; done
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import time_ms


def main() -> None:
    from semiring_ops.lazy import LazyTensor, codegen, wide_chunks

    tile, chunk, block = (int(a) for a in sys.argv[1:4])
    codegen.WIDE_TILE = wide_chunks.WIDE_TILE = tile
    codegen.WIDE_CHUNK = wide_chunks.WIDE_CHUNK = chunk
    codegen.WIDE_BLOCK = wide_chunks.WIDE_BLOCK = block
    for d in (128, 784):
        g = torch.Generator().manual_seed(d)
        x, y = torch.randn(50000, d, generator=g).cuda(), torch.randn(50000, d, generator=g).cuda()
        b = torch.randn(50000, 1, generator=g).cuda()
        dist = (LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])).abs().sum(-1)
        knn = time_ms(lambda dist=dist: dist.argKmin(10, dim=1), "cuda", 3)
        laplace = time_ms(lambda dist=dist, d=d, b=b: (-dist / d).exp() @ b, "cuda", 3)
        print(f"tile {tile}, chunk {chunk}, block {block}, D = {d}: k-NN {knn:.2f} ms, K @ b {laplace:.2f} ms")


if __name__ == "__main__":
    main()
