"""LinearChainCRF and SemiringLinear under DistributedDataParallel (issue 17, item 2): gloo CPU ranks.

Each rank takes its shard of one batch (uneven shards, each padded only to its own longest sentence) and
minimises ``crf.nll(..., reduction="sum")`` over it. DDP all-reduces the gradients and divides by the world
size, so every rank's gradient is exactly ``(1 / world) * grad(sum over the whole batch)``: the reference is
one process on the concatenated batch with the loss ``nll_sum(batch) / world``. Compared in float64 to
1e-10: every parameter's gradient after one backward, and the parameters after a few SGD steps.

FSDP runs on gloo CPU ranks with this torch (2.13), so the same comparison covers both FSDP APIs:
``fully_shard`` (FSDP2, DTensor parameters; the CRF sharded as its own unit, its ``nll`` and ``decode``
registered with ``register_fsdp_forward_method`` because they are called instead of its forward) and the
older ``FullyShardedDataParallel`` wrapper (use_orig_params=True). Both average the gradients as DDP does.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from semiring_ops.nn import SemiringLinear
from semiring_ops.structures import LinearChainCRF
from tests.dist_util import run_ranks

V, C, T, B = 11, 5, 7, 9
LENGTHS = [7, 3, 5, 1, 6, 2, 7, 4, 3]  # uneven shards: 5+4 on 2 ranks, 3+3+3 on 3 ranks (tensor_split)
STEPS, LR = 3, 0.05
TOL = 1e-10


class Tagger(nn.Module):
    """Embedding -> SemiringLinear (log) -> Linear -> LinearChainCRF; forward returns the summed NLL."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, 6)
        self.mix = SemiringLinear(6, 8, "log")
        self.out = nn.Linear(8, C)
        self.crf = LinearChainCRF(C, batch_first=True)

    def emissions(self, words: torch.Tensor) -> torch.Tensor:
        return self.out(self.mix(self.emb(words)))

    def forward(self, words: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.crf.nll(self.emissions(words), tags, mask, reduction="sum")


def make_model() -> Tagger:
    torch.manual_seed(0)
    return Tagger().double()


def make_batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    lengths = torch.tensor(LENGTHS)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    words = torch.randint(1, V, (B, T), generator=g).masked_fill(~mask, 0)
    tags = torch.randint(0, C, (B, T), generator=g).masked_fill(~mask, 0)
    return words, tags, mask


def shard(batch, rank: int, world: int):
    """This rank's rows of the batch, cut to its own longest sentence (so ranks' T differ)."""
    words, tags, mask = (x.tensor_split(world)[rank] for x in batch)
    t = int(mask.sum(1).max())
    return words[:, :t], tags[:, :t], mask[:, :t]


def reference(world: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One process, whole batch, loss = nll_sum / world: (first step's grads, params after STEPS SGD steps)."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads = {}
    for step in range(STEPS):
        opt.zero_grad()
        (model(*make_batch(step)) / world).backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def ddp_rank(rank: int, world: int) -> tuple[dict, dict, list[list[int]]]:
    model = nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads = {}
    for step in range(STEPS):
        opt.zero_grad()
        model(*shard(make_batch(step), rank, world)).backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.module.named_parameters()}
        opt.step()
    words, _, mask = shard(make_batch(0), rank, world)
    with torch.no_grad():
        decoded = model.module.crf.decode(model.module.emissions(words), mask)
    return grads, {n: p.detach().clone() for n, p in model.module.named_parameters()}, decoded


def fsdp2_rank(rank: int, world: int) -> tuple[dict, dict, list[list[int]]]:
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    model = make_model()
    fully_shard(model.crf)  # C = 5 transitions rows over 2 or 3 ranks: uneven shards
    fully_shard(model)
    # crf.nll / crf.decode are called, not crf.forward: without this the CRF's parameters stay sharded
    # (RuntimeError: semiring_ops.crf_log_likelihood.default got mixed torch.Tensor and DTensor)
    register_fsdp_forward_method(model.crf, "nll")
    register_fsdp_forward_method(model.crf, "decode")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads = {}
    for step in range(STEPS):
        opt.zero_grad()
        model(*shard(make_batch(step), rank, world)).backward()
        if step == 0:  # full_tensor() all-gathers: every rank calls it, in the same order
            grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        opt.step()
    params = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
    words, _, mask = shard(make_batch(0), rank, world)
    model.unshard()  # emissions() is not the root's forward either
    with torch.no_grad():
        decoded = model.crf.decode(model.emissions(words), mask)
    model.reshard()
    return grads, params, decoded


def fsdp1_rank(rank: int, world: int) -> tuple[dict, dict, list[list[int]]]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(make_model(), device_id=torch.device("cpu"), use_orig_params=True)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads = {}
    for step in range(STEPS):
        opt.zero_grad()
        model(*shard(make_batch(step), rank, world)).backward()
        if step == 0:
            with FSDP.summon_full_params(model, with_grads=True):  # clone: the gathered views are freed
                grads = {n: p.grad.clone() for n, p in model.module.named_parameters()}
        opt.step()
    words, _, mask = shard(make_batch(0), rank, world)
    with FSDP.summon_full_params(model), torch.no_grad():
        params = {n: p.detach().clone() for n, p in model.module.named_parameters()}
        decoded = model.module.crf.decode(model.module.emissions(words), mask)
    return grads, params, decoded


def _assert_close(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys()
    for n in want:
        err = (got[n] - want[n]).abs().max().item()
        assert err <= TOL, f"{what} {n}: max abs difference {err:.3g} > {TOL}"


@pytest.mark.parametrize(
    "wrapper, world", [("ddp", 2), ("ddp", 3), ("fully_shard", 2), ("fully_shard", 3), ("FSDP", 2)]
)
def test_data_parallel_matches_one_process(wrapper: str, world: int) -> None:
    ref_grads, ref_params = reference(world)
    fn = {"ddp": ddp_rank, "fully_shard": fsdp2_rank, "FSDP": fsdp1_rank}[wrapper]
    results = run_ranks(fn, world, timeout=120)
    # the reference's decode of each shard, with the trained parameters
    model = make_model()
    model.load_state_dict(ref_params)
    for rank, (grads, params, decoded) in enumerate(results):
        _assert_close(grads, ref_grads, f"{wrapper} rank {rank}/{world} gradient of")
        _assert_close(params, ref_params, f"{wrapper} rank {rank}/{world} after {STEPS} SGD steps,")
        words, _, mask = shard(make_batch(0), rank, world)
        with torch.no_grad():
            assert decoded == model.crf.decode(model.emissions(words), mask)
    assert all(p.abs().sum() > 0 for p in ref_grads.values())  # every parameter gets a gradient


def ddp_nccl_rank(rank: int, world: int) -> tuple[dict, dict]:
    """ddp_rank on cuda:rank over NCCL; gradients and parameters brought back to the CPU."""
    dev = torch.device("cuda", rank)
    model = nn.parallel.DistributedDataParallel(make_model().to(dev), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads = {}
    for step in range(STEPS):
        opt.zero_grad()
        model(*(t.to(dev) for t in shard(make_batch(step), rank, world))).backward()
        if step == 0:
            grads = {n: p.grad.cpu() for n, p in model.module.named_parameters()}
        opt.step()
    return grads, {n: p.detach().cpu() for n, p in model.module.named_parameters()}


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_ddp_over_nccl_matches_one_process() -> None:
    ref_grads, ref_params = reference(2)
    for rank, (grads, params) in enumerate(run_ranks(ddp_nccl_rank, 2, timeout=180, backend="nccl")):
        _assert_close(grads, ref_grads, f"NCCL DDP rank {rank}/2 gradient of")
        _assert_close(params, ref_params, f"NCCL DDP rank {rank}/2 after {STEPS} SGD steps,")
