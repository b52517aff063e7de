"""Demo: part-of-speech tagging of a real treebank with a BiLSTM-CRF built on semiring_ops.

Data: the Turkish Web Treebank (Google Research, Apache-2.0) as the PyPI package `turkish-treebanks`
ships it (`pip install turkish-treebanks`, or this repository's `.[demo]` extra): 4,851 sentences,
81k tokens of web and Wikipedia text with 14 coarse part-of-speech tags, read from the installed files
(nothing is downloaded at run time). The split is the package's own: sentence i of each file goes to
train when i % 10 < 8, to dev when i % 10 == 8 and to test when i % 10 == 9.

Model: word embeddings (lowercased, rare words -> <unk>, word dropout) + a character CNN over each
token + a BiLSTM give per-token emission scores; `semiring_ops.structures.LinearChainCRF` (pytorch-crf's
interface) adds tag-to-tag transition scores, trains on the sequence log-likelihood and decodes with
Viterbi. The same network with a per-token softmax head, and a most-frequent-tag lookup, are trained
as baselines so the CRF's contribution shows.

Runs on the GPU when there is one, else on the CPU: about 2 minutes on 2 cores, plus about a minute the
first time for the kernels' compile. Usage: python examples/crf_tagging.py [--epochs N] [--device cpu|cuda]
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
from treebank import FORM, UPOS, read_splits, to_device, train_epoch

from semiring_ops.structures import LinearChainCRF

PAD, UNK = 0, 1
MAX_WORD_CHARS = 16  # longer tokens keep their first 8 and last 8 characters (suffixes carry the tag)

Sentence = tuple[list[str], list[str]]  # (tokens, tags)


# ------------------------------------------------------------------ data


def read_treebank() -> dict[str, list[Sentence]]:
    """{train, dev, test} -> [(tokens, coarse tags)] from the installed turkish-treebanks files (treebank.py)."""
    return {k: [([r[FORM] for r in rows], [r[UPOS] for r in rows]) for rows in v] for k, v in read_splits().items()}


class Encoder:
    """Vocabularies built on the training split (lowercased words seen at least twice, characters) and
    the tag set (fixed by the treebank, so taken from every split)."""

    def __init__(self, train: list[Sentence], tagset: list[str], min_count: int = 2) -> None:
        counts = Counter(w.lower() for words, _ in train for w in words)
        self.words = ["<pad>", "<unk>", *sorted(w for w, c in counts.items() if c >= min_count)]
        self.chars = ["<pad>", "<unk>", *sorted({ch for words, _ in train for w in words for ch in w})]
        self.tags = sorted(tagset)
        self.word_ix = {w: i for i, w in enumerate(self.words)}
        self.char_ix = {c: i for i, c in enumerate(self.chars)}
        self.tag_ix = {t: i for i, t in enumerate(self.tags)}
        self.train_words = set(counts)

    def encode(self, sent: Sentence) -> tuple[list[int], list[list[int]], list[int]]:
        words, tags = sent
        w = [self.word_ix.get(x.lower(), UNK) for x in words]
        c = []
        for x in words:
            x = x if len(x) <= MAX_WORD_CHARS else x[: MAX_WORD_CHARS // 2] + x[-MAX_WORD_CHARS // 2 :]
            c.append([self.char_ix.get(ch, UNK) for ch in x])
        return w, c, [self.tag_ix[t] for t in tags]


def make_batches(encoded: list, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """Padded batches of sentences of similar length (sorted by length, then cut), built once."""
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    batches = []
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        B, T = len(idx), max(len(encoded[i][0]) for i in idx)
        W = max(len(ch) for i in idx for ch in encoded[i][1])
        words = torch.zeros(B, T, dtype=torch.long)
        chars = torch.zeros(B, T, W, dtype=torch.long)
        tags = torch.zeros(B, T, dtype=torch.long)
        for b, i in enumerate(idx):
            w, c, t = encoded[i]
            words[b, : len(w)] = torch.tensor(w)
            tags[b, : len(t)] = torch.tensor(t)
            for j, ch in enumerate(c):
                chars[b, j, : len(ch)] = torch.tensor(ch)
        lengths = torch.tensor([len(encoded[i][0]) for i in idx])
        mask = torch.arange(T)[None, :] < lengths[:, None]
        batches.append({"words": words, "chars": chars, "tags": tags, "mask": mask, "lengths": lengths, "idx": idx})
    return batches


# ------------------------------------------------------------------ model


class Tagger(nn.Module):
    """Word embedding + character CNN -> BiLSTM -> per-tag emission scores, then a CRF or a softmax."""

    def __init__(self, n_words: int, n_chars: int, n_tags: int, use_crf: bool, hidden: int = 96) -> None:
        super().__init__()
        self.word = nn.Embedding(n_words, 64, padding_idx=PAD)
        self.char = nn.Embedding(n_chars, 24, padding_idx=PAD)
        self.conv = nn.Conv1d(24, 48, kernel_size=3, padding=1)
        self.lstm = nn.LSTM(64 + 48, hidden, batch_first=True, bidirectional=True)
        self.drop = nn.Dropout(0.33)
        self.out = nn.Linear(2 * hidden, n_tags)
        self.crf = LinearChainCRF(n_tags, batch_first=True) if use_crf else None

    def emissions(self, words: torch.Tensor, chars: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        B, T, W = chars.shape
        c = self.conv(self.char(chars.view(B * T, W)).transpose(1, 2)).relu()  # (B*T, 48, W)
        c = c.masked_fill((chars.view(B * T, 1, W) == PAD), 0.0).amax(dim=2).view(B, T, -1)
        x = self.drop(torch.cat([self.word(words), c], dim=-1))
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=T)
        return self.out(self.drop(h))  # (B, T, n_tags)

    def loss(self, batch: dict) -> torch.Tensor:
        """Negative log-likelihood per token: of the tag sequence (CRF) or of each tag (softmax)."""
        em = self.emissions(batch["words"], batch["chars"], batch["lengths"])
        if self.crf is not None:
            return self.crf.nll(em, batch["tags"], batch["mask"], reduction="token_mean")
        return F.cross_entropy(em[batch["mask"]], batch["tags"][batch["mask"]])

    @torch.no_grad()
    def predict(self, batch: dict) -> torch.Tensor:
        """Best tags (B, T), -1 past each length: Viterbi under the CRF, per-token argmax without it."""
        em = self.emissions(batch["words"], batch["chars"], batch["lengths"])
        if self.crf is not None:
            return self.crf.viterbi(em, batch["mask"])[0]
        return em.argmax(-1).masked_fill(~batch["mask"], -1)


# ------------------------------------------------------------------ training and evaluation


def evaluate(predict, batches: list[dict], device: torch.device, oov: list[torch.Tensor]) -> dict[str, float]:
    """Token accuracy, accuracy on tokens unseen in training, and whole-sentence accuracy."""
    right = total = oov_right = oov_total = sent_right = sents = 0
    for batch in batches:
        pred = predict(to_device(batch, device)).cpu()
        ok = (pred == batch["tags"]) & batch["mask"]
        unseen = torch.zeros_like(batch["mask"])
        for b, i in enumerate(batch["idx"]):
            unseen[b, : len(oov[i])] = oov[i]
        right += int(ok.sum())
        total += int(batch["mask"].sum())
        oov_right += int((ok & unseen).sum())
        oov_total += int(unseen.sum())
        sent_right += int((ok | ~batch["mask"]).all(dim=1).sum())
        sents += len(batch["idx"])
    return {"acc": right / total, "oov": oov_right / max(oov_total, 1), "sent": sent_right / sents}


def train(model: Tagger, name: str, data: dict, args, device: torch.device) -> dict[str, float]:
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0 / (1.0 + 0.1 * e))
    rng = random.Random(args.seed)
    n_train = sum(len(b["idx"]) for b in data["train"])
    print(f"\n{name}")
    print(f"{'epoch':>5} {'loss':>8} {'train acc':>9} {'dev acc':>8} {'test acc':>8} {'ms/step':>8} {'sents/s':>8}")
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = list(range(len(data["train"])))
        rng.shuffle(order)
        loss_sum, seconds = train_epoch(model, data["train"], order, opt, device, args.word_dropout, UNK)
        steps = len(order)
        sched.step()
        model.eval()
        tr = evaluate(model.predict, data["train_eval"], device, data["oov"]["train_eval"])
        dv = evaluate(model.predict, data["dev"], device, data["oov"]["dev"])
        te = evaluate(model.predict, data["test"], device, data["oov"]["test"])
        print(
            f"{epoch:>5} {loss_sum / steps:>8.4f} {tr['acc']:>9.2%} {dv['acc']:>8.2%} {te['acc']:>8.2%} "
            f"{1000 * seconds / steps:>8.1f} {n_train / seconds:>8.0f}",
            flush=True,
        )
    return te


def most_frequent_tag(train: list[Sentence], enc: Encoder, sents: list[Sentence]):
    """The baseline without a model: each word's most frequent tag in training (lowercased), and the
    most frequent tag of all for words never seen. Returns a predict(batch) over `sents`."""
    per_word: dict[str, Counter] = {}
    for words, tags in train:
        for w, t in zip(words, tags, strict=True):
            per_word.setdefault(w.lower(), Counter())[t] += 1
    overall = Counter(t for _, tags in train for t in tags).most_common(1)[0][0]
    best = {w: c.most_common(1)[0][0] for w, c in per_word.items()}
    preds = [torch.tensor([enc.tag_ix[best.get(w.lower(), overall)] for w in words]) for words, _ in sents]

    def predict(batch: dict) -> torch.Tensor:
        out = torch.full(batch["mask"].shape, -1, dtype=torch.long)
        for b, i in enumerate(batch["idx"]):
            out[b, : len(preds[i])] = preds[i]
        return out

    return predict


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=8e-3)
    p.add_argument("--hidden", type=int, default=96, help="LSTM units per direction")
    p.add_argument("--word-dropout", type=float, default=0.1)
    p.add_argument("--max-sentences", type=int, default=None, help="train on the first N training sentences")
    p.add_argument("--no-baseline", action="store_true", help="skip the softmax-head baseline (halves the time)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    device = torch.device(args.device)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    start = time.perf_counter()

    splits = read_treebank()
    if args.max_sentences is not None:
        splits["train"] = splits["train"][: args.max_sentences]
    enc = Encoder(splits["train"], sorted({t for v in splits.values() for _, tags in v for t in tags}))
    encoded = {k: [enc.encode(s) for s in v] for k, v in splits.items()}
    data = {k: make_batches(v, args.batch_size if k == "train" else 256) for k, v in encoded.items()}
    data["oov"] = {
        k: [torch.tensor([w.lower() not in enc.train_words for w in words]) for words, _ in v]
        for k, v in splits.items()
    }
    # the per-epoch train accuracy on a fixed eighth of the training sentences (the whole set took a fifth of the
    # run; training never sees this choice, so the final figures do not depend on it)
    data["train_eval"] = make_batches(encoded["train"][::8], 256)
    data["oov"]["train_eval"] = data["oov"]["train"][::8]
    n_tok = {k: sum(len(w) for w, _ in v) for k, v in splits.items()}
    print(f"Turkish Web Treebank (turkish-treebanks {metadata.version('turkish-treebanks')}, Apache-2.0)")
    print(
        "  " + ", ".join(f"{k} {len(v)} sentences / {n_tok[k]} tokens" for k, v in splits.items()),
        f"\n  {len(enc.tags)} tags: {' '.join(enc.tags)}\n  {len(enc.words)} words, {len(enc.chars)} characters",
        f"\n  device {device}, {torch.get_num_threads()} CPU threads",
    )

    # the CPU/CUDA kernels compile on first use (about a minute, once; later runs load them from the cache)
    t0 = time.perf_counter()
    warm = LinearChainCRF(len(enc.tags), batch_first=True).to(device)
    em = torch.randn(2, 3, len(enc.tags), device=device, requires_grad=True)
    warm.nll(em, torch.zeros(2, 3, dtype=torch.long, device=device)).backward()
    warm.viterbi(em.detach())
    print(f"  CRF kernels ready in {time.perf_counter() - t0:.1f} s")

    mft = most_frequent_tag(splits["train"], enc, splits["test"])
    results = {"most frequent tag per word": evaluate(mft, data["test"], torch.device("cpu"), data["oov"]["test"])}

    torch.manual_seed(args.seed)
    crf_model = Tagger(len(enc.words), len(enc.chars), len(enc.tags), use_crf=True, hidden=args.hidden).to(device)
    results["BiLSTM + CRF (semiring_ops)"] = train(crf_model, "BiLSTM + CRF", data, args, device)
    if not args.no_baseline:
        torch.manual_seed(args.seed)
        soft = Tagger(len(enc.words), len(enc.chars), len(enc.tags), use_crf=False, hidden=args.hidden).to(device)
        results["BiLSTM + softmax"] = train(soft, "BiLSTM + softmax (baseline: no transitions)", data, args, device)

    print(f"\ntest set ({len(splits['test'])} sentences, {n_tok['test']} tokens):")
    print(f"  {'':<30} {'token acc':>9} {'unseen words':>12} {'whole sentence':>14}")
    for name, r in results.items():
        print(f"  {name:<30} {r['acc']:>9.2%} {r['oov']:>12.2%} {r['sent']:>14.2%}")
    trans = crf_model.crf.transitions.detach().cpu()
    i, j = divmod(int(trans.argmin()), trans.shape[1])
    k, m = divmod(int(trans.argmax()), trans.shape[1])
    print(
        f"  learned transitions: most favoured {enc.tags[k]} -> {enc.tags[m]} ({trans[k, m]:+.2f}), "
        f"least favoured {enc.tags[i]} -> {enc.tags[j]} ({trans[i, j]:+.2f})"
    )
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
