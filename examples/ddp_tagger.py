"""The README's BiLSTM-CRF tagger (examples/crf_tagging.py) trained with DistributedDataParallel.

    torchrun --nproc_per_node=2 examples/ddp_tagger.py --epochs 1        # CPU: gloo
    torchrun --nproc_per_node=4 examples/ddp_tagger.py                   # GPUs: NCCL, rank i on cuda:LOCAL_RANK

Data, vocabulary, model and evaluation are crf_tagging.py's (imported, not copied). The training sentences
are cut into length-sorted batches of batch_size / world sentences and a DistributedSampler deals them to
the ranks, so each step's global batch is --batch-size sentences, as one process with the same --batch-size
(the same number of steps per epoch). The loss is the CRF's summed negative log-likelihood over the rank's
sentences times world / (tokens in the global batch, all-reduced); DDP averages the gradients over the ranks,
so the gradient is exactly that of the global batch's per-token NLL, crf_tagging.py's ``token_mean`` loss.
Rank 0 prints each epoch's mean loss (over all ranks) and the dev and test accuracy.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crf_tagging import UNK, Encoder, Tagger, evaluate, make_batches, read_treebank, to_device

from semiring_ops.structures import LinearChainCRF


class SummedNLL(nn.Module):
    """The tagger's CRF loss as a forward, so that DDP sees (and synchronises) the call: summed NLL."""

    def __init__(self, tagger: Tagger) -> None:
        super().__init__()
        self.tagger = tagger

    def forward(self, words: torch.Tensor, chars: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor, lengths):
        em = self.tagger.emissions(words, chars, lengths)
        return self.tagger.crf.nll(em, tags, mask, reduction="sum")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="global: sentences per step over all ranks")
    p.add_argument("--lr", type=float, default=8e-3)
    p.add_argument("--hidden", type=int, default=96, help="LSTM units per direction")
    p.add_argument("--word-dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    # harmless on the CPU; on the GPU hosts NVLink SHARP / multicast must stay off
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # the ranks share the cores
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        sys.exit(f"--batch-size {args.batch_size} must be a multiple of the world size {world}")
    start = time.perf_counter()

    # every rank builds the same vocabulary and batches (deterministic); rank 0 alone evaluates
    splits = read_treebank()
    enc = Encoder(splits["train"], sorted({t for v in splits.values() for _, tags in v for t in tags}))
    encoded = {k: [enc.encode(s) for s in v] for k, v in splits.items()}
    train_batches = make_batches(encoded["train"], args.batch_size // world)
    sampler = DistributedSampler(train_batches, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    evals = {k: make_batches(encoded[k], 256) for k in ("dev", "test")} if rank == 0 else {}
    oov = {k: [torch.tensor([w.lower() not in enc.train_words for w in ws]) for ws, _ in splits[k]] for k in evals}

    # the kernels compile on first use: rank 0 first, the others then load them from the cache
    for turn in (0, 1):
        if (rank == 0) == (turn == 0):
            warm = LinearChainCRF(len(enc.tags), batch_first=True).to(device)
            em = torch.randn(2, 3, len(enc.tags), device=device, requires_grad=True)
            warm.nll(em, torch.zeros(2, 3, dtype=torch.long, device=device)).backward()
            warm.viterbi(em.detach())
        dist.barrier()

    torch.manual_seed(args.seed)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    tagger = Tagger(len(enc.words), len(enc.chars), len(enc.tags), use_crf=True, hidden=args.hidden).to(device)
    model = DistributedDataParallel(SummedNLL(tagger), device_ids=[local_rank] if cuda else None)
    torch.manual_seed(args.seed + 1 + rank)  # each rank its own dropout
    random.seed(args.seed + rank)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0 / (1.0 + 0.1 * e))
    if rank == 0:
        print(
            f"{world} ranks ({'NCCL, GPUs' if cuda else 'gloo, CPU'}), global batch {args.batch_size}, "
            f"{len(sampler)} steps per epoch, {torch.get_num_threads()} threads per rank",
            flush=True,
        )
        print(f"{'epoch':>5} {'loss':>8} {'dev acc':>8} {'test acc':>8} {'train s':>8}", flush=True)
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # summed NLL, tokens
        t0 = time.perf_counter()
        for k in sampler:
            batch = to_device(train_batches[k], device)
            if args.word_dropout > 0:
                drop = torch.rand(batch["words"].shape, device=device) < args.word_dropout
                batch["words"] = batch["words"].masked_fill(drop & batch["mask"], UNK)
            tokens = batch["mask"].sum().to(torch.float64)
            global_tokens = tokens.clone()
            dist.all_reduce(global_tokens)
            nll = model(batch["words"], batch["chars"], batch["tags"], batch["mask"], batch["lengths"])
            loss = nll * (world / global_tokens)  # DDP's average over ranks makes it the global token mean
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)  # the same all-reduced gradients on every rank
            opt.step()
            sums += torch.stack([nll.detach().to(torch.float64), tokens])
        seconds = time.perf_counter() - t0
        sched.step()
        dist.all_reduce(sums)
        if rank == 0:
            tagger.eval()
            dv = evaluate(tagger.predict, evals["dev"], device, oov["dev"])
            te = evaluate(tagger.predict, evals["test"], device, oov["test"])
            loss = float(sums[0] / sums[1])
            print(f"{epoch:>5} {loss:>8.4f} {dv['acc']:>8.2%} {te['acc']:>8.2%} {seconds:>8.1f}", flush=True)
        dist.barrier()
    if rank == 0:
        print(f"total {time.perf_counter() - start:.0f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
