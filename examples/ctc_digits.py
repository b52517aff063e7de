"""A CTC model end to end on real handwriting: lines of handwritten digits read column by column.

The data: scikit-learn's digits (1,797 handwritten 8 x 8 digits from 43 writers, UCI's "optical recognition of
handwritten digits", shipped inside the scikit-learn wheel: no download). Lines of 3 to 7 digits are made by
setting digit images side by side with gaps of 0 to 2 empty columns; the test lines use only digits the training
lines never saw. A frame is one column of 8 pixels; the model (a 1-D convolution and a bidirectional GRU) gives
each frame log-probabilities over the blank and the ten digits, trained with semiring_ops.ctc_loss (the fused
kernels). Printed: the loss per epoch; greedy decoding's line accuracy and character error rate on the test
lines; forced_align's alignment of each test line to its transcript, scored against where each digit really is
(the fraction of digits whose aligned frames fall inside the digit's own columns); one alignment drawn.

    python examples/ctc_digits.py                     # about 100 s on 2 CPU cores
    python examples/ctc_digits.py --device cuda --epochs 20

Needs scikit-learn (for its data only): pip install scikit-learn.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import semiring_ops

BLANK = 0  # label c + 1 is digit c


def make_lines(images: torch.Tensor, labels: torch.Tensor, count: int, g: torch.Generator):
    """``count`` lines of 3-7 digits drawn from ``images`` (M, 8, 8): frames (T, count, 8) zero-padded, their
    lengths, targets (count, 7) padded with the blank, target lengths, and each digit's [start, end) columns."""
    lines, spans, targets = [], [], []
    for _ in range(count):
        n = int(torch.randint(3, 8, (), generator=g))
        pick = torch.randint(0, images.shape[0], (n,), generator=g)
        columns, where = [torch.zeros(8, int(torch.randint(0, 3, (), generator=g)))], []
        for k in pick.tolist():
            start = sum(c.shape[1] for c in columns)
            columns.append(images[k])
            where.append((start, start + 8))
            columns.append(torch.zeros(8, int(torch.randint(0, 3, (), generator=g))))
        lines.append(torch.cat(columns, 1).T)  # (frames, 8)
        spans.append(where)
        targets.append(labels[pick] + 1)
    lengths = torch.tensor([line.shape[0] for line in lines])
    frames = nn.utils.rnn.pad_sequence(lines)  # (T, count, 8)
    target_lengths = torch.tensor([t.numel() for t in targets])
    padded = nn.utils.rnn.pad_sequence(targets, batch_first=True, padding_value=BLANK)
    return frames, lengths, padded, target_lengths, spans


class ColumnReader(nn.Module):
    """Frames (T, N, 8) -> log-probabilities (T, N, 11) over the blank and the ten digits."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.conv = nn.Conv1d(8, hidden, kernel_size=3, padding=1)
        self.rnn = nn.GRU(hidden, hidden, bidirectional=True)
        self.out = nn.Linear(2 * hidden, 11)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(frames.permute(1, 2, 0))).permute(2, 0, 1)  # (T, N, hidden)
        return self.out(self.rnn(x)[0]).log_softmax(-1)


def greedy(log_probs: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Best label per frame, repeats merged, blanks dropped."""
    best = log_probs.argmax(-1).T.tolist()
    out = []
    for row, n in zip(best, lengths.tolist(), strict=True):
        merged = [c for i, c in enumerate(row[:n]) if c != BLANK and (i == 0 or c != row[i - 1])]
        out.append(merged)
    return out


def edit_distance(a: list[int], b: list[int]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--train-lines", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise SystemExit("this example reads scikit-learn's digits: pip install scikit-learn") from exc

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(labels), generator=g)
    train_idx, test_idx = order[:1400], order[1400:]  # test lines use unseen handwriting samples
    train = make_lines(images[train_idx], labels[train_idx], args.train_lines, g)
    test = make_lines(images[test_idx], labels[test_idx], 400, g)
    device = torch.device(args.device)
    model = ColumnReader().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    frames, lengths, targets, target_lengths, _ = (x.to(device) if torch.is_tensor(x) else x for x in train)
    print(f"{len(labels)} handwritten digits (scikit-learn), {args.train_lines} training lines, 400 test lines")
    start = time.perf_counter()
    for epoch in range(args.epochs):
        perm, total = torch.randperm(frames.shape[1], generator=g), 0.0
        for batch in perm.split(32):
            width = int(lengths[batch].max())
            log_probs = model(frames[:width, batch])
            loss = semiring_ops.ctc_loss(log_probs, targets[batch], lengths[batch], target_lengths[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(batch)
        print(f"epoch {epoch + 1:2d}: CTC loss {total / frames.shape[1]:.3f} ({time.perf_counter() - start:.0f} s)")

    model.eval()
    frames, lengths, targets, target_lengths, spans = test
    with torch.no_grad():
        log_probs = model(frames.to(device)).cpu()
    decoded = greedy(log_probs, lengths)
    truth = [targets[n, : int(target_lengths[n])].tolist() for n in range(len(decoded))]
    exact = sum(d == t for d, t in zip(decoded, truth, strict=True)) / len(truth)
    cer = sum(edit_distance(d, t) for d, t in zip(decoded, truth, strict=True)) / sum(map(len, truth))
    print(f"greedy decoding on the test lines: {exact:.1%} lines exact, character error rate {cer:.2%}")

    # forced alignment to the transcripts (batched: one call for every line), scored against the digits' columns
    alignments, _ = semiring_ops.forced_align(log_probs.transpose(0, 1), targets, lengths, target_lengths)
    inside = placed = 0
    for n, where in enumerate(spans):
        row = alignments[n, : int(lengths[n])].tolist()
        for k, (lo, hi) in enumerate(where):
            # the frames emitting this digit: the k-th run of non-blank labels
            runs = [i for i, c in enumerate(row) if c != BLANK and (i == 0 or row[i - 1] != c or row[i - 1] == BLANK)]
            if k < len(runs):
                first = runs[k]
                last = first
                while last + 1 < len(row) and row[last + 1] == row[first]:
                    last += 1
                inside += lo <= first and last < hi
            placed += 1
    print(f"forced_align: {inside / placed:.1%} of the test digits aligned inside their own columns")
    n = 0
    row = alignments[n, : int(lengths[n])].tolist()
    print("line 0, its columns (digits as 0-9, blanks as '.') and the alignment:")
    print("  truth  " + "".join(str(t - 1) for t in truth[n]))
    print("  frames " + "".join("#" if float(frames[i, n].sum()) > 0 else " " for i in range(int(lengths[n]))))
    print("  align  " + "".join("." if c == BLANK else str(c - 1) for c in row))


if __name__ == "__main__":
    main()
