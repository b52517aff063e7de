"""Command line: ``python -m semiring_ops info`` (what is active) and ``python -m semiring_ops build`` (compile every
kernel family into the cache now, in parallel, rather than each on first use)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .info import backend_info, format_info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m semiring_ops")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, devices, compilers, and what serves each kernel family")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.add_argument("--load", action="store_true", help="load the families that need no compiling")
    build = sub.add_parser("build", help="compile every kernel family now, in parallel")
    build.add_argument(
        "--device",
        nargs="+",
        choices=["cpu", "cuda"],
        help="device types (default: cpu, and cuda when a GPU is visible or TORCH_CUDA_ARCH_LIST names targets)",
    )
    build.add_argument(
        "--family",
        nargs="+",
        help="only these families (bmm, chain, span, ctc, fast_log, packed, host_writers, hmm; the CPU autograd "
        "modules bmm_autograd, chain_autograd)",
    )
    build.add_argument("--jobs", type=int, default=None, help="compile jobs in all (default: the CPU count)")
    args = parser.parse_args(argv)
    if args.command == "info":
        report = backend_info(load=args.load)
        print(json.dumps(report, indent=1) if args.json else format_info(report))
        return 0
    return _build(args)


def _build(args: argparse.Namespace) -> int:
    import torch

    from .build.families import FAMILIES
    from .build.parallel import build_families

    devices = args.device or ["cpu"] + (
        ["cuda"] if torch.version.cuda and (torch.cuda.is_available() or os.environ.get("TORCH_CUDA_ARCH_LIST")) else []
    )
    fams = [f for f in FAMILIES if f.device_type in devices and (not args.family or f.name in args.family)]
    start = time.perf_counter()
    print(f"semiring_ops: building {len(fams)} kernel families ({', '.join(devices)})", flush=True)
    results = build_families(fams, args.jobs)
    print(f"semiring_ops: done in {time.perf_counter() - start:.1f} s", flush=True)
    print(format_info(backend_info(load=True)))
    failed = [r for r in results if r.status in ("failed", "skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
