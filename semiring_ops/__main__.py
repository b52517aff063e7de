"""Command line: ``python -m semiring_ops info`` (what is active) and ``python -m semiring_ops build``
(compile the kernels into the cache now rather than on first use)."""

from __future__ import annotations

import argparse
import json
import sys

from .info import backend_info, format_info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m semiring_ops")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, devices, active backends and the build cache")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.add_argument("--no-load", action="store_true", help="do not build or load the kernels")
    sub.add_parser("build", help="build the kernels for every available device type now")
    args = parser.parse_args(argv)
    report = backend_info(load=not getattr(args, "no_load", False))
    if args.command == "info":
        print(json.dumps(report, indent=1) if args.json else format_info(report))
        return 0
    failed = [dt for dt, b in report["backends"].items() if b["kind"] == "reference"]
    print(format_info(report))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
