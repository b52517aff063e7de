"""HMM EM over data sharded across the ranks of a torch.distributed process group (``HMM.fit(group=g)``).

Every rank runs the E-step on its own shard; the statistics the M-step needs (the log-likelihood, the
expected start and transition counts and the emission model's sufficient statistics) are packed into one
flat tensor and summed across ranks with one ``dist.all_reduce`` per iteration (gloo on CPU, NCCL on GPU),
so every rank takes the same M-step: the model of a one-process fit on the union of the shards.

Before EM, one ``dist.all_gather`` of a few numbers per rank checks that the ranks agree (model type and
sizes, n_iter, tol, params) and that every rank's input passed its checks; a disagreement or a bad input on
any rank raises ValueError on every rank (never a hang). Then rank 0's parameters are broadcast, so every
rank starts from the same model.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.distributed as dist
from torch import Tensor

from .emissions.base import Emission

__all__ = ["broadcast_parameters", "check_agreement", "emission_m_step", "emission_stats", "group_size"]


def group_size(group) -> tuple[int, int]:
    """(this process's rank in `group`, the group's size)."""
    return dist.get_rank(group), dist.get_world_size(group)


def _src(group, group_rank: int) -> int:
    return dist.get_global_rank(group, group_rank) if group is not dist.group.WORLD else group_rank


def check_agreement(
    fields: dict[str, float], error: BaseException | None, n_samples: int, group, device: torch.device
) -> int:
    """all_gather of `fields` (numbers that must be equal on every rank), an error flag and n_samples;
    raises ValueError on every rank naming what differs (or re-raises `error` where it happened).
    Returns the total number of samples over the group."""
    world = dist.get_world_size(group)
    names = list(fields)
    mine = torch.tensor(
        [float(error is not None), float(n_samples), *(float(fields[k]) for k in names)],
        dtype=torch.float64,
        device=device,
    )
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    table = torch.stack(gathered).cpu()
    failed = [r for r in range(world) if table[r, 0] != 0]
    if failed:
        if error is not None:
            raise error
        raise ValueError(f"distributed HMM.fit: the input of rank(s) {failed} failed its checks (see those ranks)")
    for j, name in enumerate(names, start=2):
        col = table[:, j].tolist()
        if any(v != col[0] and not (math.isnan(v) and math.isnan(col[0])) for v in col):
            raise ValueError(f"distributed HMM.fit: the ranks disagree on {name}: {dict(enumerate(col))} (rank: value)")
    return int(table[:, 1].sum())


def broadcast_parameters(module: torch.nn.Module, group, group_src: int = 0) -> None:
    """Overwrite every rank's parameters of `module` with those of group rank `group_src`."""
    src = _src(group, group_src)
    with torch.no_grad():
        for p in module.parameters():
            buf = p.detach().clone()
            dist.broadcast(buf, src, group=group)
            p.copy_(buf)


def emission_fields(emission: Emission | None) -> dict[str, float]:
    """What must agree across ranks about the emission model: its class (by name) and its own fields."""
    if emission is None:
        return {"emission model": 0.0}
    name = f"{type(emission).__module__}.{type(emission).__qualname__}"
    return {"emission model": float(zlib.crc32(name.encode())), **emission.agreement_fields()}


def emission_stats(emission: Emission, x: Tensor, weights: Tensor) -> list[Tensor]:
    """The sufficient statistics of the emission M-step from observations x (N, *event) and posteriors
    weights (N, C), as tensors to be summed across ranks."""
    return list(emission.sufficient_stats(x, weights))


def emission_m_step(emission: Emission, stats: list[Tensor], params: str | None) -> None:
    """The emission model's M-step from summed statistics (same formulas as its own ``m_step``)."""
    emission.m_step_from_stats(stats, params)
