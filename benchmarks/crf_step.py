"""One CRF train step and one decode on the GPU, nothing else: the three chain kernels (forward scan with
the gold path, reverse scan with the gradient, Viterbi) for a profiler to capture.

Reproduce the profiles in docs/perf_notes.md:
    ncu --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \\
        --section LaunchStats --section Occupancy -k regex:chain_kernel -c 3 \\
        python benchmarks/crf_step.py 8 128 512
"""

from __future__ import annotations

import argparse

import torch

from semiring_ops.structures import LinearChainCRF


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("B", type=int, help="sequences")
    parser.add_argument("T", type=int, help="steps")
    parser.add_argument("C", type=int, help="tags")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    em = torch.randn(args.B, args.T, args.C, generator=g).to(args.device).requires_grad_()
    tags = torch.randint(0, args.C, (args.B, args.T), generator=g).to(args.device)
    mask = torch.ones(args.B, args.T, dtype=torch.bool, device=args.device)
    crf = LinearChainCRF(args.C, batch_first=True).to(args.device)
    with torch.no_grad():
        crf.transitions.normal_()
    crf.nll(em, tags, mask).backward()
    with torch.no_grad():
        crf.viterbi(em, mask)
    if args.device == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
