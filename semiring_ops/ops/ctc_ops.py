"""CTC's fused programs, registered with torch.library (contracts in csrc/ops.h, programs in csrc/ctc_dp.h):

semiring_ops::ctc_log(log_probs, targets, input_lengths, target_lengths, blank, need_states)
    -> (log Z (N,), states (N, T, 2 S + 1) or (0,))
    log_probs (T, N, C) float32 / float64, targets (N, S) int64 padded, lengths (N,) int64; one launch. With
    need_states, the state occupancies at each item's frames (undefined past them), which ctc_collect sums.
    Differentiable in log_probs (needs need_states): the gradient of log Z times the loss's gradient is
    ctc_collect's, one launch in the backward writing it whole (no zeroed occupancy kept from the forward, no
    product); its own gradient (double backward) comes from the CTC structure's PyTorch program
semiring_ops::ctc_collect(log_probs, targets, input_lengths, target_lengths, blank, total, states, weight)
    -> (T, N, C) weight[n] * d log Z_n / d log_probs: each frame's label posteriors times the item's weight,
    0 * weight past its frames and for an item with no alignment
semiring_ops::ctc_viterbi(log_probs, targets, input_lengths, target_lengths, blank)
    -> (best score (N,), states (N, T) int64, -1 past each item's frames)
    differentiable in log_probs through the score: 1 at the best path's (frame, label) entries
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..build.backends import backend_for
from ..hooks import Hook
from .registry import eager_function, plain_eager

# log_partition by the CTC structure's PyTorch program, (log_probs, targets, input_lengths, target_lengths, blank,
# semiring) -> (N,): what ctc_log's double backward differentiates (alignment/ctc.py installs it).
reference_log_partition = Hook("ctc_log's double backward", "semiring_ops.alignment")


def state_labels(targets: Tensor, blank: int) -> Tensor:
    """(B, 2 S + 1) int64: the label of each extended-target state (blank, l_1, blank, ..., l_S, blank) of targets
    (B, S)."""
    states = torch.full((targets.shape[0], 2 * targets.shape[1] + 1), blank, dtype=torch.long, device=targets.device)
    states[:, 1::2] = targets
    return states


__all__ = [
    "ctc_collect",
    "ctc_kernels",
    "ctc_kernels_or_raise",
    "ctc_log",
    "ctc_log_fast",
    "ctc_occupancy",
    "ctc_viterbi",
    "path_indicator",
]


def ctc_kernels(device: torch.device):
    """The ctc family's module for ``device``, or None (no compiled kernels: callers run the PyTorch program)."""
    return backend_for(device).family("ctc")


def ctc_kernels_or_raise(device: torch.device, op: str):
    """The ctc family's module for an op's body: eager callers choose the op only when ctc_kernels has it, but a
    graph torch.compile traced takes them to be there (alignment/ctc.py, fused_ok), so say what is missing."""
    module = ctc_kernels(device)
    if module is None:
        raise RuntimeError(
            f"semiring_ops::{op}: no compiled ctc kernels for {device.type} "
            f"({backend_for(device).detail or 'see python -m semiring_ops info'}); under torch.compile the CTC and "
            "RNN-T losses need them (eager calls run the PyTorch program instead)"
        )
    return module


def _ctc_log_body(
    log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, blank: int, need_states: bool
) -> tuple[Tensor, Tensor]:
    module = ctc_kernels_or_raise(log_probs.device, "ctc_log")
    return tuple(module.ctc_log(log_probs, targets, input_lengths, target_lengths, blank, need_states))


@torch.library.custom_op("semiring_ops::ctc_log", mutates_args=())
def ctc_log(
    log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, blank: int, need_states: bool
) -> tuple[Tensor, Tensor]:
    """(log Z (N,), states): see the module docstring."""
    return _ctc_log_body(log_probs, targets, input_lengths, target_lengths, blank, need_states)


@ctc_log.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank, need_states):
    T, N = log_probs.shape[:2]
    states = log_probs.new_empty((N, T, 2 * targets.shape[1] + 1) if need_states else (0,))
    return log_probs.new_empty((N,)), states


def _ctc_collect_body(log_probs: Tensor, *args) -> Tensor:
    return ctc_kernels_or_raise(log_probs.device, "ctc_collect").ctc_collect(log_probs, *args)


@torch.library.custom_op("semiring_ops::ctc_collect", mutates_args=())
def ctc_collect(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    total: Tensor,
    states: Tensor,
    weight: Tensor,
) -> Tensor:
    """(T, N, C) weight times the occupancies: see the module docstring."""
    return _ctc_collect_body(log_probs, targets, input_lengths, target_lengths, blank, total, states, weight)


@ctc_collect.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank, total, states, weight):
    return log_probs.new_empty(log_probs.shape)


def ctc_occupancy(
    log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, blank: int
) -> tuple[Tensor, Tensor]:
    """(log Z (N,), occupancy (T, N, C) = d log Z / d log_probs): each frame's label posteriors, by ctc_log and
    ctc_collect (no gradient)."""
    total, states = ctc_log(log_probs, targets, input_lengths, target_lengths, blank, True)
    ones = torch.ones_like(total)
    return total, ctc_collect(log_probs, targets, input_lengths, target_lengths, blank, total, states, ones)


def _log_setup_context(ctx, inputs, output):
    log_probs, targets, input_lengths, target_lengths, blank, _need_states = inputs
    ctx.blank = blank
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # (else the backward is handed a zeroed tensor the size of the states)
    ctx.save_for_backward(log_probs, targets, input_lengths, target_lengths, output[0], output[1])


def _backward(ctx, grad_total, collect) -> tuple:
    """ctc_log's backward, its collection by `collect` (ctc_collect's signature)."""
    log_probs, targets, input_lengths, target_lengths, total, states = ctx.saved_tensors
    if grad_total is None:
        return (None,) * 6
    if torch.is_grad_enabled():  # a graph of the gradient (double backward): the structure's PyTorch program
        with torch.enable_grad():
            again = reference_log_partition(log_probs, targets, input_lengths, target_lengths, ctx.blank, "log")
            (grad,) = torch.autograd.grad(again, log_probs, grad_total, create_graph=True)
        return grad, None, None, None, None, None
    if states.dim() != 3:
        raise RuntimeError("semiring_ops::ctc_log: backward needs the forward's need_states=True")
    weight = grad_total.to(total)
    grad = collect(log_probs, targets, input_lengths, target_lengths, ctx.blank, total, states, weight)
    return grad, None, None, None, None, None


def _log_backward(ctx, grad_total, _grad_states):
    return _backward(ctx, grad_total, ctc_collect)


ctc_log.register_autograd(_log_backward, setup_context=_log_setup_context)
# the same body and formula as an autograd.Function, without the ops' dispatch (~50 µs a call each on the GPU host)
_CtcLogEager = eager_function(
    "_CtcLogEager",
    _ctc_log_body,
    _log_setup_context,
    lambda ctx, grad_total, _grad_states: _backward(ctx, grad_total, _ctc_collect_body),
)


def ctc_log_fast(
    log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, blank: int, need_states: bool
) -> tuple[Tensor, Tensor]:
    """ctc_log by the quickest route: on plain eager tensors (registry.plain_eager) the same kernels and backward
    through an autograd.Function, else the registered op (torch.compile's graphs, functorch, dispatch modes)."""
    if plain_eager(log_probs, targets, input_lengths, target_lengths):
        return _CtcLogEager.apply(log_probs, targets, input_lengths, target_lengths, blank, need_states)
    return ctc_log(log_probs, targets, input_lengths, target_lengths, blank, need_states)


@torch.library.custom_op("semiring_ops::ctc_viterbi", mutates_args=())
def ctc_viterbi(
    log_probs: Tensor, targets: Tensor, input_lengths: Tensor, target_lengths: Tensor, blank: int
) -> tuple[Tensor, Tensor]:
    """(best score (N,), states (N, T)): see the module docstring."""
    module = ctc_kernels_or_raise(log_probs.device, "ctc_viterbi")
    return tuple(module.ctc_viterbi(log_probs, targets, input_lengths, target_lengths, blank))


@ctc_viterbi.register_fake
def _(log_probs, targets, input_lengths, target_lengths, blank):
    T, N = log_probs.shape[:2]
    return log_probs.new_empty((N,)), log_probs.new_empty((N, T), dtype=torch.long)


def _viterbi_setup_context(ctx, inputs, output):
    log_probs, targets, _input_lengths, _target_lengths, blank = inputs
    ctx.blank, ctx.shape = blank, log_probs.shape
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(targets, output[1])


def _viterbi_backward(ctx, grad_total, _grad_states):
    if grad_total is None:
        return (None,) * 5
    targets, states = ctx.saved_tensors
    return path_indicator(states, targets, ctx.blank, ctx.shape, grad_total), None, None, None, None


def path_indicator(states: Tensor, targets: Tensor, blank: int, shape: torch.Size, weight: Tensor) -> Tensor:
    """(T, N, C): weight[n] at each frame's label on item n's path (states (N, T), -1: no frame), else 0."""
    T, N, C = shape
    labels = state_labels(targets, blank).gather(1, states.clamp(min=0))  # (N, T)
    on_path = (states >= 0).to(weight.dtype) * weight[:, None]
    out = weight.new_zeros((N, T, C))
    out.scatter_(2, labels[..., None], on_path[..., None])
    return out.transpose(0, 1)


ctc_viterbi.register_autograd(_viterbi_backward, setup_context=_viterbi_setup_context)
