"""benchmarks/plots.py: PNGs from JSONs in the schema benchmarks/bmm.py and benchmarks/crf.py write with --json."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BMM_PNGS = {"bmm_fwd_time.png", "bmm_fwd_bwd_time.png", "bmm_peak_memory.png"}
CRF_PNGS = {"crf_time.png", "crf_peak_memory.png"}


@pytest.fixture(scope="module")
def plots() -> ModuleType:
    """benchmarks/plots.py as a module (benchmarks/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "plots.py"
    spec = importlib.util.spec_from_file_location("benchmark_plots", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bmm_row(op: str, n: int, impl: str, scale: float = 1.0, peaks: bool = True, **cells: object) -> dict:
    """A row as bmm.py writes it (peaks as on CUDA, or null as on the CPU); cells override its values."""
    fwd = scale * 1e-6 * n**2.2
    mib = scale * 8 * 4 * n * n / 2**20
    row = {
        "op": op,
        "B": 8,
        "n": n,
        "impl": impl,
        "fwd_ms": fwd,
        "fwd_bwd_ms": 2.5 * fwd,
        "cells_per_s": 8 * n**3 / (fwd * 1e-3),
        "fwd_peak_mib": mib if peaks else None,
        "fwd_bwd_peak_mib": 2 * mib if peaks else None,
    }
    return {**row, **cells}


def bmm_json(rows: list[dict], gpu: str | None = "NVIDIA H200") -> dict:
    """bmm.py's top level."""
    device = "cuda" if gpu else "cpu"
    return {"device": device, "gpu": gpu, "torch": "2.11.0+cu130", "date": "2026-11-23", "ceilings": {}, "rows": rows}


def crf_row(shape: tuple[int, int, int], system: str, train: object, decode: object, peak: object) -> dict:
    """A row as crf.py writes it."""
    B, T, C = shape
    row = {"B": B, "T": T, "C": C, "system": system, "train_ms": train, "decode_ms": decode, "peak_mib": peak}
    return {**row, "train_x_ours": None, "decode_x_ours": None, "gcells_per_s": None}


def crf_json(rows: list[dict], device: str = "NVIDIA H100 80GB HBM3") -> dict:
    """crf.py's top level."""
    return {"meta": {"device": device, "torch": "2.11.0+cu130", "ragged": False, "date": "2026-11-23"}, "rows": rows}


def gpu_bmm() -> dict:
    """Every op and size of a default GPU run, with the anchors' skips and n/a as bmm.py writes them."""
    impls = {
        "log": ("semiring_ops", "torch naive", "semiring-einsum"),
        "max": ("semiring_ops", "torch naive", "semiring-einsum"),
        "min": ("semiring_ops",),
        "std": ("semiring_ops", "torch.bmm"),
    }
    rows = []
    for op, names in impls.items():
        for n in (64, 128, 256, 512, 1024):
            for i, impl in enumerate(names):
                cells: dict[str, object] = {}
                if impl == "torch naive" and n == 1024:
                    cells = {"fwd_ms": "skip", "fwd_bwd_ms": "skip", "cells_per_s": None}
                    cells |= {"fwd_peak_mib": None, "fwd_bwd_peak_mib": None}
                if impl == "semiring-einsum" and op == "max":
                    cells = {"fwd_bwd_ms": "n/a", "fwd_bwd_peak_mib": None}
                rows.append(bmm_row(op, n, impl, scale=1 + 3 * i, **cells))
    return bmm_json(rows)


def gpu_crf() -> dict:
    """The five anchor shapes, torch-struct out of memory at the larger C as in docs/benchmarks.md."""
    rows = []
    for shape in ((32, 128, 8), (32, 128, 32), (32, 128, 128), (32, 512, 32), (8, 128, 512)):
        big = shape[2] >= 128
        rows += [
            crf_row(shape, "ours", 1.5, 0.35, 0.45),
            crf_row(shape, "ours .decode", None, 0.48, None),
            crf_row(shape, "pytorch-crf", 71.4, 53.2, 40.0),
            crf_row(shape, "torch-struct", "OOM" if big else 2.8, "OOM" if shape[2] == 512 else 2.2, 20.0 * shape[2]),
            crf_row(shape, "torch loop", 23.8, None, 12.0),
        ]
    return crf_json(rows)


def run(plots: ModuleType, tmp_path: Path, bmm: dict | None = None, crf: dict | None = None) -> dict[str, Path]:
    """Writes the JSONs, runs plots.main into tmp_path/png and returns the written PNGs by name."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    argv = ["--out", str(tmp_path / "png")]
    for flag, data in (("--bmm", bmm), ("--crf", crf)):
        if data is not None:
            path = tmp_path / f"{flag[2:]}.json"
            path.write_text(json.dumps(data))
            argv += [flag, str(path)]
    written = plots.main(argv)
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == sorted(p.name for p in written)
    return {p.name: p for p in written}


def assert_pngs(paths: dict[str, Path], names: set[str]) -> None:
    """Exactly these PNGs, each a real, non-trivial PNG."""
    assert set(paths) == names
    for path in paths.values():
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC, path
        assert len(data) > 20_000, (path, len(data))


def test_gpu_jsons_give_every_figure(plots: ModuleType, tmp_path: Path) -> None:
    assert_pngs(run(plots, tmp_path, gpu_bmm(), gpu_crf()), BMM_PNGS | CRF_PNGS)


def test_failed_and_missing_cells_do_not_crash(plots: ModuleType, tmp_path: Path) -> None:
    bmm = bmm_json(
        [
            bmm_row("log", 256, "semiring_ops"),
            bmm_row("log", 512, "semiring_ops", fwd_bwd_ms="OOM", fwd_bwd_peak_mib="OOM"),
            bmm_row("log", 256, "genbmm", fwd_ms="ERR RuntimeError: CUDA error: invalid argument", fwd_peak_mib=None),
            bmm_row("log", 512, "genbmm", fwd_ms=None, fwd_bwd_ms=float("nan"), fwd_peak_mib=0.0),
            # an op with no number at all: failure marks only
            bmm_row("max", 1024, "torch naive", fwd_ms="OOM", fwd_bwd_ms="skip", fwd_peak_mib="OOM"),
        ]
    )
    crf = crf_json(
        [
            crf_row((8, 128, 512), "ours", 14.3, 4.3, 20.0),
            crf_row((8, 128, 512), "torch-struct", "OOM", "OOM", "OOM"),
            crf_row((8, 128, 512), "pytorch-crf", "unavailable", "unavailable", None),
            crf_row((8, 128, 512), "torch loop", "ERR RuntimeError: x", None, "ERR RuntimeError"),
        ]
    )
    assert_pngs(run(plots, tmp_path, bmm, crf), BMM_PNGS | CRF_PNGS)


def test_cpu_jsons_skip_the_memory_figures(plots: ModuleType, tmp_path: Path) -> None:
    bmm = bmm_json([bmm_row("max", n, impl, peaks=False) for n in (16, 32) for impl in ("semiring_ops", "torch naive")])
    bmm["gpu"], bmm["device"] = None, "cpu"
    crf = crf_json([crf_row((4, 32, 8), "ours", 0.14, 0.02, None)], device="CPU, 2 threads")
    assert_pngs(run(plots, tmp_path, bmm, crf), {"bmm_fwd_time.png", "bmm_fwd_bwd_time.png", "crf_time.png"})


def test_one_json_alone(plots: ModuleType, tmp_path: Path) -> None:
    assert_pngs(run(plots, tmp_path, bmm=bmm_json([bmm_row("std", 64, "torch.bmm")])), BMM_PNGS)
    assert_pngs(run(plots, tmp_path / "crf", crf=gpu_crf()), CRF_PNGS)


def test_needs_a_json(plots: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        plots.main(["--out", str(tmp_path)])


@pytest.mark.parametrize(
    ("value", "number", "failure"),
    [
        (1.5, 1.5, None),
        (3, 3.0, None),
        (0.0, None, None),
        (float("inf"), None, None),
        (None, None, None),
        (True, None, None),
        ("OOM", None, "OOM"),
        ("skip", None, "skip"),
        ("ERR RuntimeError: boom", None, "ERR"),
        ("n/a", None, None),
        ("unavailable", None, None),
    ],
)
def test_cell_values(plots: ModuleType, value: object, number: float | None, failure: str | None) -> None:
    assert plots.number(value) == number
    assert plots.failure(value) == failure
