"""The RNN-T lattice (Graves, 2012) as a structure, generic over the semiring.

An item with T_b frames and target labels y_1 .. y_{U_b} has the cells (t, u), 0 <= t < T_b, 0 <= u <= U_b: u
labels emitted after t frames were consumed. From (t, u) a path either emits the blank, moving to (t + 1, u), with
potential ``blank[t, u]``, or emits y_{u+1} (u < U_b), moving to (t, u + 1), with potential ``emit[t, u]``. Paths
run from (0, 0) to (T_b - 1, U_b) and end with that cell's blank. Their score is the semiring product of their
moves' potentials; ``logpartition`` sums it over the paths:

    alpha[0, 0] = one,
    alpha[t, u] = (alpha[t - 1, u] (x) blank[t - 1, u]) (+) (alpha[t, u - 1] (x) emit[t, u - 1]),
    total = alpha[T_b - 1, U_b] (x) blank[T_b - 1, U_b].

Potentials (B, T, U + 1, 2): ``[..., 0]`` the blank, ``[..., 1]`` the label; ``emit[t, U_b]`` and the cells past an
item's frames or labels are not used (they are taken as the semiring's zero, whatever they hold). The recursion
walks the anti-diagonals t + u (T + U steps), all of a diagonal's cells at once. It is the program behind
:func:`semiring_ops.alignment.rnnt_loss` in any semiring, and the reference for a fused kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..semirings import Semiring
from .base import Structure, check_lengths

__all__ = ["RNNT"]


class RNNT(Structure):
    """The RNN-T lattice of a batch (module docstring); target_lengths (B,) the items' label counts U_b."""

    name = "RNNT"

    def __init__(self, target_lengths: Tensor) -> None:
        self.target_lengths = torch.as_tensor(target_lengths).long()

    def logpartition(self, potentials: Tensor, lengths: Tensor | None, semiring: type[Semiring]) -> Tensor:
        """(*lead, B): the semiring sum over each item's paths; potentials (*lead, B, T, U + 1, 2) (semiring values:
        a semiring with leading dims gets them converted, Structure.value), lengths the items' frames (B,)."""
        S = semiring
        if potentials.dim() < 4 or potentials.shape[-1] != 2:
            raise ValueError(f"RNNT: potentials must be (B, T, U + 1, 2), got {tuple(potentials.shape)}")
        B, T, U1 = potentials.shape[-4:-1]
        device = potentials.device
        labels = self.target_lengths.to(device)
        if labels.shape != (B,) or (B and (int(labels.min()) < 0 or int(labels.max()) > U1 - 1)):
            raise ValueError(f"RNNT: target_lengths must be (B,) = ({B},) in [0, U = {U1 - 1}], got {labels.tolist()}")
        frames = check_lengths(lengths, B, T, device, "RNNT")
        if B == 0:
            return S.zeros((0,), like=potentials)
        # the moves that exist: a blank in every cell of the item, a label below its last label
        t_in = torch.arange(T, device=device)[:, None] < frames[:, None, None]  # (B, T, 1)
        u_cells = torch.arange(U1, device=device)
        used = torch.stack(
            [t_in & (u_cells <= labels[:, None, None]), t_in & (u_cells < labels[:, None, None])], -1
        )  # (B, T, U1, 2)
        pot = torch.where(used, potentials, S.zeros((B, T, U1, 2), like=potentials))
        # skewed onto the diagonals d = t + u: moves[..., d, u, :] = pot[..., d - u, u, :] (zero off the lattice)
        D = T + U1 - 1
        t_of = torch.arange(D, device=device)[:, None] - u_cells  # (D, U1)
        on = (t_of >= 0) & (t_of < T)
        index = t_of.clamp(0, T - 1)[:, :, None].expand(*pot.shape[:-3], D, U1, 2)
        moves = torch.where(on[:, :, None], pot.gather(-3, index), S.zeros((B, D, U1, 2), like=pot))
        row = torch.cat([S.ones((B, 1), like=pot), S.zeros((B, U1 - 1), like=pot)], -1)
        rows = [row]
        nothing = S.zeros((B, 1), like=pot)
        for d in range(1, D):
            out = S.times(row[..., None], moves[..., d - 1, :, :])  # (..., U1, 2): through a blank, a label
            row = S.sum(torch.stack([out[..., 0], torch.cat([nothing, out[..., :-1, 1]], -1)], -1), -1)
            rows.append(row)
        alpha = torch.stack(rows, -2)  # (..., B, D, U1)
        end_d = (frames - 1 + labels)[:, None, None]  # the last cell's diagonal and column
        last = alpha.gather(-2, end_d.expand(*alpha.shape[:-2], 1, U1)).squeeze(-2)
        last = last.gather(-1, labels[:, None].expand(*last.shape[:-1], 1)).squeeze(-1)
        final_blank = moves.gather(-3, end_d[..., None].expand(*moves.shape[:-3], 1, U1, 2))[..., 0, :, 0]
        final_blank = final_blank.gather(-1, labels[:, None].expand(*final_blank.shape[:-1], 1)).squeeze(-1)
        return S.times(last, final_blank)
