"""Demo: dependency parsing of a real treebank with a BiLSTM + biaffine scorer and a tree CRF (DependencyCRF).

Data: the Turkish Web Treebank (Google Research, Apache-2.0) as the PyPI package `turkish-treebanks`
ships it (this repository's `.[demo]` extra): 4,851 sentences of web and Wikipedia text in CoNLL-U with a
head and a relation (44 labels, the treebank's Stanford-style scheme) per token, one root per sentence.
Read from the installed files (examples/treebank.py); train / dev / test as the package splits them.

Model: word embeddings (lowercased, rare words -> <unk>, word dropout) + embeddings of the treebank's gold
coarse tags -> a 2-layer BiLSTM -> `semiring_ops.nn.BiaffineArcScorer`: arc scores (B, N, N) in
DependencyCRF's [head, modifier] layout (the root on the diagonal) and label scores per arc. Two parsers
are trained from the same initialisation on the same sentences:

  tree CRF        loss -log p(gold tree) under DependencyCRF(arcs, lengths, multiroot=False): a
                  distribution over projective trees whose root has one child (UD's one root per
                  sentence); decoded with its argmax (Eisner), so every prediction is a projective tree.
  head selection  the baseline: per-word cross-entropy over its candidate heads (the root included),
                  decoded by each word's argmax: nothing makes the output a tree.

Both predict each word's relation by a softmax over labels at the head chosen (trained at the gold head).
Reported: UAS and LAS (every token, punctuation included), and the share of sentences whose predicted
heads form a well-formed tree: exactly one word headed by the root and no cycle (every word reaches the
root); projectivity is not required, and reported apart.

The CRF's likelihood covers projective trees only, so training keeps the projective sentences (93.5% of
them) and, by default, those of at most 60 tokens; dev and test are evaluated whole. Runs on the GPU
when there is one, else on the CPU: about 3 minutes on 2 cores with the defaults, plus about a minute the
first time for the kernels' compile. Usage: python examples/dependency_parsing.py [--epochs N] [--max-train N]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from importlib import metadata

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from treebank import DEPREL, FORM, HEAD, UPOS, Row, read_splits, to_device, train_epoch

from semiring_ops.distributions import DependencyCRF
from semiring_ops.nn import BiaffineArcScorer

PAD, UNK = 0, 1
WORD_DROPOUT = 0.1  # share of training words replaced by <unk>, which teaches the <unk> embedding


# ------------------------------------------------------------------ trees


def is_well_formed(heads: list[int]) -> bool:
    """Whether CoNLL-U heads (0 the root, else a word's 1-based position) form a tree: exactly one word
    headed by the root, and every word reaches the root (no cycle). Crossing arcs are allowed."""
    if sum(h == 0 for h in heads) != 1:
        return False
    for start in range(1, len(heads) + 1):
        seen, node = set(), start
        while node != 0:
            if node in seen:
                return False
            seen.add(node)
            node = heads[node - 1]
    return True


def is_projective(heads: list[int]) -> bool:
    """Whether no two arcs cross, the root counted as position 0 at the far left (Eisner's trees)."""
    arcs = [(min(h, m), max(h, m)) for m, h in enumerate(heads, start=1)]
    return not any(a < c < b < d for a, b in arcs for c, d in arcs)


def to_arc_layout(heads: list[int]) -> list[int]:
    """CoNLL-U heads (0 the root, else a 1-based position) -> column indices of the [head, modifier] arc
    layout: word m's head h is row h - 1 of column m, the root its diagonal, row m."""
    return [m if h == 0 else h - 1 for m, h in enumerate(heads)]


def to_conll(heads: list[int]) -> list[int]:
    """The inverse of to_arc_layout."""
    return [0 if h == m else h + 1 for m, h in enumerate(heads)]


# ------------------------------------------------------------------ data


class Vocab:
    """Words (lowercased, seen at least twice in training), coarse tags and relations (fixed by the
    treebank's scheme, so taken from every split)."""

    def __init__(self, train: list[list[Row]], every: list[list[Row]], min_count: int = 2) -> None:
        counts = Counter(r[FORM].lower() for rows in train for r in rows)
        self.words = ["<pad>", "<unk>", *sorted(w for w, c in counts.items() if c >= min_count)]
        self.tags = ["<pad>", *sorted({r[UPOS] for rows in every for r in rows})]
        self.rels = sorted({r[DEPREL] for rows in every for r in rows})
        self.word_ix = {w: i for i, w in enumerate(self.words)}
        self.tag_ix = {t: i for i, t in enumerate(self.tags)}
        self.rel_ix = {t: i for i, t in enumerate(self.rels)}


def make_batches(sents: list[list[Row]], vocab: Vocab, batch_size: int) -> list[dict]:
    """Padded batches of sentences of similar length, built once; ``heads`` (B, N) in the arc layout's terms
    (to_arc_layout), a padding word's its own index."""
    order = sorted(range(len(sents)), key=lambda i: len(sents[i]))
    batches = []
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        B, N = len(idx), max(len(sents[i]) for i in idx)
        words, tags, rels = (torch.zeros(B, N, dtype=torch.long) for _ in range(3))
        heads = torch.arange(N).repeat(B, 1)  # padding words: "headed by the root", never read
        for b, i in enumerate(idx):
            rows = sents[i]
            words[b, : len(rows)] = torch.tensor([vocab.word_ix.get(r[FORM].lower(), UNK) for r in rows])
            tags[b, : len(rows)] = torch.tensor([vocab.tag_ix[r[UPOS]] for r in rows])
            rels[b, : len(rows)] = torch.tensor([vocab.rel_ix[r[DEPREL]] for r in rows])
            heads[b, : len(rows)] = torch.tensor(to_arc_layout([int(r[HEAD]) for r in rows]))
        lengths = torch.tensor([len(sents[i]) for i in idx])
        mask = torch.arange(N)[None, :] < lengths[:, None]
        batches.append({"words": words, "tags": tags, "heads": heads, "rels": rels, "mask": mask, "lengths": lengths})
    return batches


# ------------------------------------------------------------------ model


class Parser(nn.Module):
    """Word + tag embeddings -> BiLSTM -> BiaffineArcScorer; ``crf``: trained and decoded as a tree CRF
    (DependencyCRF), else by per-word head selection."""

    def __init__(self, vocab: Vocab, crf: bool, hidden: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.crf = crf
        self.word = nn.Embedding(len(vocab.words), 100, padding_idx=PAD)
        self.tag = nn.Embedding(len(vocab.tags), 32, padding_idx=PAD)
        self.lstm = nn.LSTM(132, hidden, num_layers=layers, batch_first=True, bidirectional=True, dropout=0.33)
        self.drop = nn.Dropout(0.33)
        self.scorer = BiaffineArcScorer(2 * hidden, arc_dim=128, n_labels=len(vocab.rels), label_dim=64)

    def scores(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Arc scores (B, N, N) [head, modifier] and label scores (B, N, N, labels)."""
        x = self.drop(torch.cat([self.word(batch["words"]), self.tag(batch["tags"])], dim=-1))
        N = x.shape[1]
        packed = pack_padded_sequence(x, batch["lengths"].cpu(), batch_first=True, enforce_sorted=False)
        h, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=N)
        return self.scorer(self.drop(h), batch["lengths"])

    def loss(self, batch: dict) -> torch.Tensor:
        """Per-token arc loss (the gold tree's negative log-likelihood under the CRF, or each word's head
        cross-entropy) + per-token label cross-entropy at the gold heads."""
        arcs, labels = self.scores(batch)
        mask, heads, n_tokens = batch["mask"], batch["heads"], batch["mask"].sum()
        if self.crf:
            gold = F.one_hot(heads, arcs.shape[-1]).transpose(1, 2).to(arcs.dtype) * mask[:, None, :]
            arc_loss = -DependencyCRF(arcs, batch["lengths"], multiroot=False).log_prob(gold).sum() / n_tokens
        else:
            arc_loss = F.cross_entropy(arcs.transpose(1, 2)[mask], heads[mask])
        return arc_loss + F.cross_entropy(labels_at(labels, heads)[mask], batch["rels"][mask])

    @torch.no_grad()
    def predict(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Heads (B, N) in the arc layout's terms (make_batches) and relations (B, N); padding arbitrary."""
        arcs, labels = self.scores(batch)
        if self.crf:
            arcs = DependencyCRF(arcs, batch["lengths"], multiroot=False).argmax
        heads = arcs.argmax(dim=1)
        return heads, labels_at(labels, heads).argmax(-1)


def labels_at(labels: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """(B, N, labels): each word's label scores on the arc from head ``heads`` (B, N) (arc-layout terms)."""
    B, N, _, L = labels.shape
    return labels.gather(1, heads[:, None, :, None].expand(B, 1, N, L)).squeeze(1)


# ------------------------------------------------------------------ training and evaluation


def evaluate(model: Parser, batches: list[dict], device: torch.device) -> dict[str, float]:
    """UAS, LAS over every token; shares of sentences whose predicted heads are a well-formed tree and a
    projective one."""
    model.eval()
    uas = las = tokens = well_formed = projective = sents = 0
    for batch in batches:
        heads, rels = (t.cpu() for t in model.predict(to_device(batch, device)))
        mask = batch["mask"]
        right = (heads == batch["heads"]) & mask
        uas += int(right.sum())
        las += int((right & (rels == batch["rels"])).sum())
        tokens += int(mask.sum())
        for b, n in enumerate(batch["lengths"].tolist()):
            conll = to_conll(heads[b, :n].tolist())
            ok = is_well_formed(conll)
            well_formed += ok
            projective += ok and is_projective(conll)
        sents += len(batch["lengths"])
    return {
        "uas": uas / tokens,
        "las": las / tokens,
        "well_formed": well_formed / sents,
        "projective": projective / sents,
    }


def train(model: Parser, name: str, data: dict, args: argparse.Namespace, device: torch.device) -> dict:
    """Adam over the training batches for ``args.epochs`` epochs, printing loss, dev scores and time per
    epoch; returns the last epoch's test scores."""
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.9))
    rng = random.Random(args.seed)
    print(f"\n{name}")
    print(f"{'epoch':>5} {'loss':>8} {'dev UAS':>8} {'dev LAS':>8} {'seconds':>8}")
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = list(range(len(data["train"])))
        rng.shuffle(order)
        loss_sum, seconds = train_epoch(model, data["train"], order, opt, device, WORD_DROPOUT, UNK)
        dev = evaluate(model, data["dev"], device)
        print(
            f"{epoch:>5} {loss_sum / len(order):>8.4f} {dev['uas']:>8.2%} {dev['las']:>8.2%} {seconds:>8.1f}",
            flush=True,
        )
    return evaluate(model, data["test"], device)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Trains and evaluates both parsers; returns {model name: test scores (evaluate's keys)}."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--max-train", type=int, default=None, help="train on the first N usable training sentences")
    p.add_argument("--max-len", type=int, default=60, help="train on sentences of at most this many tokens")
    p.add_argument("--max-eval", type=int, default=None, help="evaluate on the first N dev and test sentences")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--hidden", type=int, default=128, help="LSTM units per direction")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    start = time.perf_counter()

    splits = read_splits()
    vocab = Vocab(splits["train"], [s for v in splits.values() for s in v])
    heads_of = {k: [[int(r[HEAD]) for r in rows] for rows in v] for k, v in splits.items()}
    projective = [is_projective(h) for h in heads_of["train"]]
    keep = [rows for rows, ok in zip(splits["train"], projective, strict=True) if ok and len(rows) <= args.max_len]
    train_sents = keep[: args.max_train]
    evals = {k: splits[k][: args.max_eval] for k in ("dev", "test")}
    data = {"train": make_batches(train_sents, vocab, args.batch_size)}
    data.update({k: make_batches(v, vocab, 256) for k, v in evals.items()})
    test_heads = heads_of["test"][: args.max_eval]

    n_tok = {k: sum(len(s) for s in v) for k, v in splits.items()}
    print(f"Turkish Web Treebank (turkish-treebanks {metadata.version('turkish-treebanks')}, Apache-2.0)")
    print("  " + ", ".join(f"{k} {len(v)} sentences / {n_tok[k]} tokens" for k, v in splits.items()))
    print(
        f"  training on {len(train_sents)} sentences / {sum(map(len, train_sents))} tokens: the projective ones "
        f"({projective.count(False)} are not) of at most {args.max_len} tokens"
        + (f", first {args.max_train}" if args.max_train is not None else "")
    )
    print(f"  evaluating on {len(evals['dev'])} dev / {len(evals['test'])} test sentences, every length")
    print(f"  {len(vocab.words)} words, {len(vocab.tags) - 1} tags, {len(vocab.rels)} relations")
    print(f"  device {device}, {torch.get_num_threads()} CPU threads")

    # the Eisner kernel compiles on first use (about a minute, once; later runs load it from the cache)
    t0 = time.perf_counter()
    warm = torch.zeros(2, 3, 3, device=device, requires_grad=True)
    DependencyCRF(warm, torch.tensor([3, 2], device=device), multiroot=False).partition.sum().backward()
    print(f"  tree CRF kernels ready in {time.perf_counter() - t0:.1f} s")

    results = {}
    for name, crf in (("tree CRF (DependencyCRF)", True), ("head selection (softmax)", False)):
        torch.manual_seed(args.seed)
        model = Parser(vocab, crf=crf, hidden=args.hidden).to(device)
        results[name] = train(model, name, data, args, device)

    gold = {
        "well_formed": sum(map(is_well_formed, test_heads)) / len(test_heads),
        "projective": sum(map(is_projective, test_heads)) / len(test_heads),
    }
    print(f"\ntest set ({len(test_heads)} sentences, {sum(map(len, test_heads))} tokens; every token scored):")
    print(f"  {'':<26} {'UAS':>7} {'LAS':>7} {'well-formed trees':>17} {'projective trees':>16}")
    for name, r in results.items():
        print(f"  {name:<26} {r['uas']:>7.2%} {r['las']:>7.2%} {r['well_formed']:>17.2%} {r['projective']:>16.2%}")
    print(f"  {'gold trees':<26} {'':>7} {'':>7} {gold['well_formed']:>17.2%} {gold['projective']:>16.2%}")
    print("  well-formed: one word headed by the root and no cycle; projective: well-formed without crossing arcs")
    print(f"total {time.perf_counter() - start:.0f} s")
    return results


if __name__ == "__main__":
    main()
