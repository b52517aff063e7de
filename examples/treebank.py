"""The Turkish Web Treebank as the examples read it, and the small helpers their training loops share.

The corpus is the one the PyPI package `turkish-treebanks` installs (this repository's `.[demo]` extra):
4,851 sentences in CoNLL-U (data/web.conllu, data/wiki.conllu) with coarse tags, heads and relations.
Nothing is downloaded at run time. The split is the package's own: sentence i of each file goes to train
when i % 10 < 8, to dev when i % 10 == 8 and to test when i % 10 == 9.

Used by examples/crf_tagging.py (tokens and tags) and examples/dependency_parsing.py (tokens, tags, heads,
relations); each picks its columns from the rows.
"""

from __future__ import annotations

import sys
import time
from importlib import metadata

import torch

Row = list[str]  # the 10 CoNLL-U columns of one token: ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC
FORM, UPOS, HEAD, DEPREL = 1, 3, 6, 7  # column indices

__all__ = ["DEPREL", "FORM", "HEAD", "UPOS", "Row", "read_splits", "sync", "to_device"]


def read_splits() -> dict[str, list[list[Row]]]:
    """{train, dev, test} -> sentences, each a list of token rows (multiword ranges and empty nodes skipped).

    The files are found through the distribution's file list rather than by importing the package,
    whose protobuf module does not load under protobuf >= 4 (and is not needed to read CoNLL-U)."""
    try:
        dist = metadata.distribution("turkish-treebanks")
    except metadata.PackageNotFoundError:
        sys.exit("needs the corpus package: pip install turkish-treebanks  (or: pip install -e '.[demo]')")
    paths = sorted(str(f.locate()) for f in dist.files or [] if f.suffix == ".conllu")
    if not paths:
        sys.exit("turkish-treebanks is installed but its .conllu files are missing")
    splits: dict[str, list[list[Row]]] = {"train": [], "dev": [], "test": []}
    for path in paths:  # sorted, as the package's own reader: data/web.conllu, data/wiki.conllu
        with open(path, encoding="utf-8") as f:
            blocks = [b.strip() for b in f.read().split("\n\n")]
        for i, block in enumerate(blocks):
            rows = [line.split("\t") for line in block.splitlines() if line and not line.startswith("#")]
            rows = [r for r in rows if len(r) == 10 and r[0].isdigit()]  # skip multiword ranges, empty nodes
            if not rows:
                continue
            split = "train" if i % 10 < 8 else ("dev" if i % 10 == 8 else "test")
            splits[split].append(rows)
    return splits


def to_device(batch: dict, device: torch.device) -> dict:
    """The batch's tensors moved to ``device`` (other entries as they are)."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def sync(device: torch.device) -> None:
    """Waits for the GPU's queued work (so that wall-clock timings are honest); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_epoch(
    model: torch.nn.Module, batches: list[dict], order: list[int], opt: torch.optim.Optimizer, device: torch.device,
    word_dropout: float, unk: int,
) -> tuple[float, float]:  # fmt: skip
    """One pass of ``opt`` over ``batches`` in ``order`` (``model.loss(batch)``: a scalar; gradients clipped to
    norm 5), words replaced by ``unk`` with probability ``word_dropout`` (teaches the <unk> embedding on words
    the model has seen). Returns (summed loss, seconds, GPU work included)."""
    loss_sum = 0.0
    sync(device)
    t0 = time.perf_counter()
    for k in order:
        batch = to_device(batches[k], device)
        if word_dropout > 0:
            drop = torch.rand(batch["words"].shape, device=device) < word_dropout
            batch["words"] = batch["words"].masked_fill(drop & batch["mask"], unk)
        loss = model.loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        loss_sum += loss.item()
    sync(device)
    return loss_sum, time.perf_counter() - t0
