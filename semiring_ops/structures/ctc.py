"""CTC alignments (Graves et al., 2006) as a structure, generic over the semiring.

An item with target labels l_1 .. l_L has the 2L + 1 states of its extended target: blank, l_1, blank, l_2, ...,
l_L, blank (state s is a label when s is odd). An alignment of its T frames is a state per frame that starts in
state 0 or 1, moves up by 0 or 1 state a frame, or by 2 from label to label when the two labels differ
(skipping the blank between them), and ends in state 2L or 2L - 1 at the item's last frame. Its score is the
semiring product of its frames' potentials ``emission[b, t, z_t]`` (emission: the frame's label scores gathered
onto the states, :meth:`CTC.emissions`); logpartition sums it over the alignments.

The recursion walks the frames keeping one row of K = 2 S + 1 values per item (S the longest target; states past
an item's 2L never feed back into its end states), with each item frozen after its last frame. It is the
reference of the fused kernels (csrc/ctc_dp.h, through semiring_ops.alignment), which run it for the log and max
semirings; this program serves every other semiring, double backward, and devices without compiled kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops.ctc_ops import state_labels
from ..semirings import Semiring
from .base import Structure, check_lengths

__all__ = ["CTC"]


class CTC(Structure):
    """The CTC topology of a batch of targets (module docstring).

    targets (B, S) int64, padded past each item's length; target_lengths (B,); ``blank`` the blank label.
    """

    name = "CTC"

    def __init__(self, targets: Tensor, target_lengths: Tensor, blank: int = 0) -> None:
        self.blank = blank
        self.target_lengths = target_lengths.long()
        ext = state_labels(targets, blank)
        self.states = ext  # (B, K): the label of each state
        # the skip into label state s from s - 2: s a label differing from the previous label
        skip = torch.zeros_like(ext, dtype=torch.bool)
        skip[:, 3::2] = ext[:, 3::2] != ext[:, 1:-2:2]
        self.skip = skip

    def emissions(self, scores: Tensor) -> Tensor:
        """(..., B, T, K): each frame's scores (..., B, T, V) at the states' labels."""
        index = self.states[:, None, :].expand(*scores.shape[:-1], self.states.shape[1])
        return scores.gather(-1, index)

    def logpartition(self, potentials: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        """(*lead, B): the semiring sum over alignments; potentials (*lead, B, T, K) emissions (semiring values:
        a semiring with leading dims gets them converted, Structure.value), lengths the frames (B,)."""
        S = semiring
        B, T, K = potentials.shape[-3:]
        items, states = self.states.shape
        if states != K or B % max(items, 1) or (B and not items):
            raise ValueError(
                f"CTC: potentials must be (B, T, K) with (B, K) = ({items}, {states}), got {tuple(potentials.shape)}"
            )
        copies = B // items if items else 1  # Structure.sample folds its draws into the batch: the items repeated
        skip, target_lengths = self.skip.repeat(copies, 1), self.target_lengths.repeat(copies)
        lengths = check_lengths(lengths, B, T, potentials.device, "CTC")
        zero = S.zeros((B, K), like=potentials)
        start = torch.zeros(K, dtype=torch.bool, device=potentials.device)
        start[: min(2, K)] = True
        alpha = torch.where(start, potentials[..., :, 0, :], zero)
        for t in range(1, T):
            stay = alpha
            step = torch.cat([zero[..., :1], alpha[..., :-1]], -1)
            skip_from = torch.where(skip, torch.cat([zero[..., :2], alpha[..., :-2]], -1), zero)
            moved = S.times(S.sum(torch.stack([stay, step, skip_from], -1), -1), potentials[..., :, t, :])
            alpha = torch.where((t < lengths)[:, None], moved, alpha)
        last = 2 * target_lengths  # the final blank; the last label just before it (when there is one)
        ends = torch.stack([last, (last - 1).clamp(min=0)], -1)  # (B, 2)
        final = alpha.gather(-1, ends.expand(*alpha.shape[:-1], 2))
        final = torch.where(torch.stack([torch.ones_like(last, dtype=torch.bool), last > 0], -1), final, zero[..., :2])
        return S.sum(final, -1)

    def best_path(self, potentials: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The best alignment of each item, ties broken as torchaudio's forced_align (a skip only when strictly
        better than the other two moves, a step only when strictly better than staying; the final blank only
        when strictly better than the last label): (score (B,), states (B, T) int64, -1 past each item's frames
        and everywhere for an item without an alignment). potentials (B, T, K) emissions, lengths (B,) in 1..T.
        The PyTorch reference of the fused kernels' best path (csrc/ctc_dp.h)."""
        B, T, K = potentials.shape
        zero = torch.tensor(-torch.inf, dtype=potentials.dtype, device=potentials.device)
        alpha = torch.full((B, K + 2), -torch.inf, dtype=potentials.dtype, device=potentials.device)
        alpha[:, 2] = 0  # before the first frame: one at state 0 (states shifted by 2: two -inf columns first)
        moves = torch.zeros((B, T, K), dtype=torch.long, device=potentials.device)
        for t in range(T):
            x0, x1 = alpha[:, 2:], alpha[:, 1:-1]
            x2 = torch.where(self.skip, alpha[:, :-2], zero)
            two = (x2 > x1) & (x2 > x0)
            step = ~two & (x1 > x0)
            moves[:, t] = torch.where(two, 2, torch.where(step, 1, 0))
            best = torch.where(two, x2, torch.where(step, x1, x0)) + potentials[:, t]
            alpha = torch.where((t < lengths)[:, None], torch.cat([alpha[:, :2], best], 1), alpha)
        last = 2 * self.target_lengths
        final = alpha[:, 2:]
        end_blank = final.gather(1, last[:, None])[:, 0]
        end_label = final.gather(1, (last - 1).clamp(min=0)[:, None])[:, 0]
        state = torch.where((last > 0) & ~(end_blank > end_label), last - 1, last)
        score = torch.where(state == last, end_blank, end_label)
        states = torch.full((B, T), -1, dtype=torch.long, device=potentials.device)
        reachable = score > -torch.inf
        for t in range(T - 1, -1, -1):
            on = (t < lengths) & reachable
            states[:, t] = torch.where(on, state, -1)
            state = torch.where(on, state - moves[:, t].gather(1, state[:, None])[:, 0], state)
        return score, states
