"""The RNN-T loss with torchaudio's interface (torchaudio.functional.rnnt_loss / transforms.RNNTLoss), on the RNN-T
lattice structure (structures/rnnt.py), in the log semiring (the loss) or the max semiring (``semiring="max"``: the
best alignment's score, the Viterbi loss).

The (B, T, U + 1, V) logits are read, never copied into a second tensor of their size in the forward:
- with ``fused_log_softmax`` (the default) each cell's log-softmax normaliser is one logsumexp over V, (B, T, U + 1);
- the lattice's potentials are the two entries a cell's moves use, gathered: its blank and its next label,
  (B, T, U + 1, 2);
- the dynamic program runs on those and, when a gradient is wanted, gives each move's posterior in the same
  launch (kept for the backward, as torchaudio makes its gradient in the forward);
- the gradient with respect to the logits is the one tensor of their size: softmax x (the cell's occupancy) minus
  the moves' posteriors at the blank and the next label (without fused_log_softmax, the logits are taken as
  log-probabilities: minus the posteriors alone), clamped to [-clamp, clamp] when ``clamp`` > 0, as torchaudio's.

Differences from torchaudio: targets and lengths may be int32 or int64; logits may be float64 or bfloat16 (float16
and bfloat16 are computed in float32); the lengths need not reach the tensors' sizes (torchaudio requires
max(logit_lengths) = T and max(target_lengths) = U); the loss is once differentiable, as torchaudio's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..ops.ctc_ops import ctc_kernels
from ..ops.registry import eager_function
from ..ops.rnnt_ops import rnnt_lattice
from ..semirings import LogSemiring, MaxSemiring
from ..structures.rnnt import RNNT

__all__ = ["RNNTLoss", "rnnt_loss"]

_SEMIRINGS = {"log": LogSemiring, "max": MaxSemiring}
_REDUCTIONS = ("none", "mean", "sum")


def rnnt_loss(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank: int = -1,
    clamp: float = -1,
    reduction: str = "mean",
    fused_log_softmax: bool = True,
    semiring: str = "log",
) -> Tensor:
    """The RNN-T loss (torchaudio.functional.rnnt_loss's signature and semantics, module docstring).

    logits (B, T, U + 1, V) the joiner's outputs; targets (B, U) integer labels, padded; logit_lengths (B,) the
    items' frames in [1, T]; target_lengths (B,) their labels in [0, U]; ``blank`` the blank label (negative:
    counted from V); ``clamp`` > 0 clamps each gradient entry to [-clamp, clamp]; reduction "none" -> (B,),
    "mean" / "sum" -> a scalar; ``semiring`` "log" (the loss) or "max" (minus the best alignment's score).
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f'rnnt_loss: reduction should be one of "none", "mean", or "sum", got {reduction!r}')
    if semiring not in _SEMIRINGS:
        raise ValueError(f"rnnt_loss: semiring must be one of {tuple(_SEMIRINGS)}, got {semiring!r}")
    blank, padded = _check(logits, targets, logit_lengths, target_lengths, blank)
    args = (logits, targets.long(), logit_lengths.long(), target_lengths.long(), blank, float(clamp))
    args += (fused_log_softmax, semiring == "max", padded)
    if torch.compiler.is_compiling():  # the registered op with its autograd formula: opaque to the tracer
        costs = rnnt_costs(*args, True)[0]
    else:  # the same body and formula without the op's dispatch; the posteriors only when a gradient is wanted
        costs = _RNNTCostsEager.apply(*args, torch.is_grad_enabled() and logits.requires_grad)[0]
    if reduction == "mean":
        return costs.mean()
    if reduction == "sum":
        return costs.sum()
    return costs


class RNNTLoss(nn.Module):
    """torchaudio.transforms.RNNTLoss's interface on :func:`rnnt_loss` (``semiring="max"``: the Viterbi loss)."""

    def __init__(
        self,
        blank: int = -1,
        clamp: float = -1.0,
        reduction: str = "mean",
        fused_log_softmax: bool = True,
        semiring: str = "log",
    ) -> None:
        super().__init__()
        self.blank, self.clamp, self.reduction = blank, clamp, reduction
        self.fused_log_softmax, self.semiring = fused_log_softmax, semiring

    def forward(self, logits: Tensor, targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor) -> Tensor:
        return rnnt_loss(
            logits, targets, logit_lengths, target_lengths, self.blank, self.clamp, self.reduction,
            self.fused_log_softmax, self.semiring,
        )  # fmt: skip


def _check(
    logits: Tensor, targets: Tensor, logit_lengths: Tensor, target_lengths: Tensor, blank: int
) -> tuple[int, bool]:
    """(the blank label in [0, V), whether an item is shorter than the tensors in frames or labels), or ValueError
    naming the argument, its shape, dtype or device. The lengths and labels are read in one synchronisation."""
    if not isinstance(logits, Tensor) or logits.dim() != 4 or not logits.is_floating_point():
        got = f"{tuple(logits.shape)} {logits.dtype}" if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"rnnt_loss: logits must be a (B, T, U + 1, V) floating tensor, got {got}")
    B, T, U1, V = logits.shape
    for name, t, shape in (
        ("targets", targets, (B, U1 - 1)),
        ("logit_lengths", logit_lengths, (B,)),
        ("target_lengths", target_lengths, (B,)),
    ):
        if not isinstance(t, Tensor) or tuple(t.shape) != shape or t.is_floating_point() or t.is_complex():
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"rnnt_loss: {name} must be an integer tensor of shape {shape}, got {got}")
        if t.device != logits.device:
            raise ValueError(f"rnnt_loss: {name} is on {t.device}, logits on {logits.device}")
    if not -V <= blank < V:
        raise ValueError(
            f"rnnt_loss: blank must be in [-V, V) = [{-V}, {V}) for logits of V = {V} classes, got {blank}"
        )
    if not B:
        return blank % V, False
    if torch.compiler.is_compiling():  # the values are not read while torch.compile traces (eager calls check them)
        return blank % V, True
    used = torch.arange(U1 - 1, device=targets.device) < target_lengths[:, None]
    labels = torch.where(used, targets, 0)  # (padding read as label 0: always in range)
    ends = [logit_lengths.min(), logit_lengths.max(), target_lengths.min(), target_lengths.max()]
    ends += [labels.amin(), labels.amax()] if labels.numel() else []
    bounds = torch.stack([e.long() for e in ends]).tolist()
    (lo_f, hi_f, lo_t, hi_t), (lo_l, hi_l) = bounds[:4], bounds[4:] or (0, 0)
    if T < 1 or lo_f < 1 or hi_f > T:
        raise ValueError(f"rnnt_loss: logit_lengths must be in [1, T = {T}], got {logit_lengths.tolist()}")
    if lo_t < 0 or hi_t > U1 - 1:
        raise ValueError(f"rnnt_loss: target_lengths must be in [0, U = {U1 - 1}], got {target_lengths.tolist()}")
    if lo_l < 0 or hi_l >= V:
        raise ValueError(f"rnnt_loss: targets must be labels in [0, V = {V}) within target_lengths")
    return blank % V, lo_f < T or lo_t < U1 - 1


def _move_labels(targets: Tensor, target_lengths: Tensor, blank: int, T: int) -> Tensor:
    """(B, T, U + 1, 2) int64: the label of each cell's two moves, the blank and the next target (0 past the
    item's labels, whatever the padding holds)."""
    B, U = targets.shape
    nxt = torch.where(torch.arange(U, device=targets.device) < target_lengths[:, None], targets, 0)
    nxt = torch.cat([nxt, nxt.new_zeros(B, 1)], 1)
    return torch.stack([torch.full_like(nxt, blank), nxt], -1)[:, None].expand(B, T, U + 1, 2)


def _potentials(logits: Tensor, moves: Tensor, fused: bool) -> tuple[Tensor, Tensor | None]:
    """(potentials (B, T, U + 1, 2) in the compute dtype: each cell's blank and next-label log-probability, the
    normaliser (B, T, U + 1) or None without fused_log_softmax); ``moves`` from _move_labels."""
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    pot = logits.gather(-1, moves).to(compute)
    if not fused:
        return pot, None
    norm = torch.logsumexp(logits.to(compute), -1)
    return pot - norm[..., None], norm


def _lattice(pot: Tensor, frames: Tensor, labels: Tensor, semiring: str, posteriors: bool) -> tuple[Tensor, Tensor]:
    """(total (B,), posteriors (B, T, U + 1, 2) or None): the ctc family's fused program (csrc/rnnt_dp.h) where it
    is built (taken to be there while torch.compile traces), else the structure's PyTorch program and its
    autograd."""
    if torch.compiler.is_compiling() or ctc_kernels(pot.device) is not None:
        total, post = rnnt_lattice(pot, frames, labels, semiring == "max", posteriors)
        return total, (post if posteriors else None)
    if not posteriors:
        with torch.no_grad():
            return RNNT(labels).logpartition(pot, frames, _SEMIRINGS[semiring]), None
    with torch.enable_grad():
        pot = pot.detach().requires_grad_()
        total = RNNT(labels).logpartition(pot, frames, _SEMIRINGS[semiring])
        (post,) = torch.autograd.grad(total.sum(), pot)  # each move's posterior (max: 1 on the best path)
    return total.detach(), torch.where(torch.isfinite(total)[:, None, None, None], post, torch.zeros_like(post))


def _logits_grad(
    logits: Tensor,
    targets: Tensor,
    target_lengths: Tensor,
    norm: Tensor | None,
    post: Tensor,
    blank: int,
    clamp: float,
    padded: bool,
    grad_costs: Tensor,
) -> Tensor:
    """The logits' gradient (module docstring): softmax x occupancy (norm: the fused normaliser, None without
    fused_log_softmax) minus the posteriors at each cell's two moves, clamped, times the costs' cotangent."""
    B, T, U1, V = logits.shape
    moves = _move_labels(targets, target_lengths, blank, T)
    with torch.no_grad():
        compute = post.dtype
        if norm is not None:  # softmax x occupancy: the normaliser's share of both moves
            occupancy = post.sum(-1, keepdim=True)
            grad = logits.to(compute) - norm[..., None]
            grad.exp_().mul_(occupancy)
            if padded:
                grad.masked_fill_(occupancy == 0, 0)  # the padding: never read, whatever it holds
        else:
            grad = torch.zeros((B, T, U1, V), dtype=compute, device=logits.device)
        grad.scatter_add_(-1, moves, -post)
        if clamp > 0:
            grad.clamp_(-clamp, clamp)
        grad.mul_(grad_costs.to(compute)[:, None, None, None])
    return grad.to(logits.dtype)


def _costs(
    logits: Tensor,
    targets: Tensor,
    frames: Tensor,
    target_lengths: Tensor,
    blank: int,
    fused: bool,
    semiring: str,
    need_grad: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(costs (B,) in the logits' dtype, the normaliser or None, the posteriors or None): both paths' forward."""
    with torch.no_grad():
        pot, norm = _potentials(logits, _move_labels(targets, target_lengths, blank, logits.shape[1]), fused)
    # the posteriors with the total, as torchaudio makes its gradient in the forward: one program, (B, T, U + 1, 2)
    # kept rather than the potentials
    total, post = _lattice(pot, frames, target_lengths, semiring, need_grad)
    return (-total).to(logits.dtype), norm, post


def _rnnt_costs_body(
    logits: Tensor,
    targets: Tensor,
    logit_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    clamp: float,
    fused: bool,
    max: bool,
    padded: bool,
    need_grad: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(costs (B,), the normaliser (B, T, U + 1) or (0,) without ``fused``, the posteriors (B, T, U + 1, 2) or (0,)
    without ``need_grad``); int64 targets and lengths; ``clamp`` and ``padded`` serve the gradient."""
    costs, norm, post = _costs(
        logits, targets, logit_lengths, target_lengths, blank, fused, "max" if max else "log", need_grad
    )

    def empty() -> Tensor:  # (one each: outputs never alias one another)
        return logits.new_empty((0,), dtype=_compute_dtype(logits))

    return costs, (norm if norm is not None else empty()), (post if post is not None else empty())


def _compute_dtype(logits: Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


# Under torch.compile a registered op with its autograd formula, which the tracer does not look into (torch 2.11's
# dynamo traced an autograd.Function with ctx.needs_input_grad all False: a zero gradient); eager calls run the same
# body and formula as an autograd.Function (_RNNTCostsEager), without the op's dispatch.
rnnt_costs = torch.library.custom_op("semiring_ops::rnnt_costs", mutates_args=())(_rnnt_costs_body)


@rnnt_costs.register_fake
def _(logits, targets, logit_lengths, target_lengths, blank, clamp, fused, max, padded, need_grad):
    B, T, U1, _ = logits.shape
    compute = _compute_dtype(logits)
    norm = logits.new_empty((B, T, U1) if fused else (0,), dtype=compute)
    return logits.new_empty((B,)), norm, logits.new_empty((B, T, U1, 2) if need_grad else (0,), dtype=compute)


def _rnnt_costs_setup_context(ctx, inputs, output):
    logits, targets, _frames, target_lengths, blank, clamp, fused, _max, padded, _need_grad = inputs
    _costs_out, norm, post = output
    ctx.mark_non_differentiable(norm, post)
    ctx.set_materialize_grads(False)  # (else the backward is handed zeroed tensors the size of norm and post)
    ctx.blank, ctx.clamp, ctx.padded, ctx.fused = blank, clamp, padded, fused
    ctx.save_for_backward(logits, targets, target_lengths, norm, post)


def _rnnt_costs_backward(ctx, grad_costs, _grad_norm, _grad_post):
    if grad_costs is None:  # (grads are not materialised: setup_context)
        return (None,) * 10
    logits, targets, target_lengths, norm, post = ctx.saved_tensors
    norm = norm if ctx.fused else None
    grad = _logits_grad(logits, targets, target_lengths, norm, post, ctx.blank, ctx.clamp, ctx.padded, grad_costs)
    return grad, *(None,) * 9


rnnt_costs.register_autograd(_rnnt_costs_backward, setup_context=_rnnt_costs_setup_context)
# (once differentiable, as torchaudio's: a second derivative raises rather than reads a gradient made without a graph)
_RNNTCostsEager = eager_function(
    "_RNNTCostsEager",
    _rnnt_costs_body,
    _rnnt_costs_setup_context,
    torch.autograd.function.once_differentiable(_rnnt_costs_backward),
)
