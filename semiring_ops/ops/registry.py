"""The custom operators, registered with torch.library so autograd, torch.compile and FakeTensor
tracing all see them as single ops.

    semiring_ops::bmm_forward(a, b, semiring_id, with_arg) -> (out, arg)
        a (B, n, k), b (B, k, m) -> out (B, n, m) in the accumulation dtype, arg (B, n, m) int64 or (0,)
    semiring_ops::log_bmm_backward(a, b, c, g, need_a, need_b) -> (grad_a, grad_b)
        the log semiring's gradient; differentiable itself (double backward)
    semiring_ops::log_contract(l0, l1, r0, r1, o0) -> out
        the weighted contraction that the log gradients are made of (csrc/ops.h)

Gradients never materialise the (B, n, k, m) product:
  log:      grad_a[i,k] = sum_j exp(a_ik + b_kj - c_ij) g_ij  (and grad_b alike): both from one pass over the
            cells on the CPU (the backend's log_bmm_grads), one log_contract each on CUDA
  max/min:  the gradient goes to the selected k (scatter of g at arg); outputs equal to the
            semiring zero (every term -inf for max) get none
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..build.backends import backend_for
from ..build.reference import accumulation_dtype
from ..semirings import SEMIRINGS

__all__ = ["bmm_forward", "bmm_forward_eager", "log_bmm_backward", "log_contract", "plain_eager"]

_SELECTS = {s.kernel_id: s.selects for s in SEMIRINGS.values()}
_ZERO = {s.kernel_id: s.zero for s in SEMIRINGS.values()}
_LOG = SEMIRINGS["log"].kernel_id
_STD = SEMIRINGS["std"].kernel_id


# ---------------------------------------------------------------- log_contract


@torch.library.custom_op("semiring_ops::log_contract", mutates_args=())
def log_contract(l0: Tensor, l1: Tensor | None, r0: Tensor, r1: Tensor | None, o0: Tensor) -> Tensor:
    """out[p,r,s] = sum_t L1[p,r,t] R1[p,t,s] exp(L0[p,r,t] + R0[p,t,s] + O0[p,r,s]).

    l0, l1: (B, R, T); r0, r1: (B, T, S); o0: (B, R, S); float32 or float64 -> (B, R, S).
    """
    return backend_for(l0.device).log_contract(l0, l1, r0, r1, o0)


@log_contract.register_fake
def _(l0, l1, r0, r1, o0):
    return l0.new_empty((l0.shape[0], l0.shape[1], r0.shape[2]))


# ---------------------------------------------------------------- bmm_forward


@torch.library.custom_op("semiring_ops::bmm_forward", mutates_args=())
def bmm_forward(a: Tensor, b: Tensor, semiring_id: int, with_arg: bool) -> tuple[Tensor, Tensor]:
    """Semiring batched matmul of 3-D a (B, n, k) and b (B, k, m); see the module docstring."""
    return tuple(backend_for(a.device).bmm_forward(a, b, semiring_id, with_arg))


@bmm_forward.register_fake
def _(a, b, semiring_id, with_arg):
    B, n, _ = a.shape
    m = b.shape[2]
    out = a.new_empty((B, n, m), dtype=accumulation_dtype(a.dtype))
    arg_shape = (B, n, m) if with_arg and _SELECTS[semiring_id] else (0,)
    return out, a.new_empty(arg_shape, dtype=torch.int64)


def _bmm_setup_context(ctx, inputs, output):
    a, b, semiring_id, _with_arg = inputs
    out, arg = output
    ctx.semiring_id = semiring_id
    ctx.save_for_backward(a, b, out, arg)


def _bmm_backward(ctx, grad_out, _grad_arg):
    a, b, out, arg = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if grad_out is None or not (need_a or need_b):
        return None, None, None, None
    if ctx.semiring_id == _LOG:
        ga, gb = log_bmm_backward_eager(a, b, out, grad_out, need_a, need_b)
    elif _SELECTS[ctx.semiring_id]:
        ga, gb = _selection_backward(a, b, out, arg, grad_out, ctx.semiring_id)
    elif ctx.semiring_id == _STD:  # (+, x): torch.bmm's gradients
        g = grad_out.to(out.dtype)
        ga = torch.bmm(g, b.to(out.dtype).transpose(1, 2)) if need_a else None
        gb = torch.bmm(a.to(out.dtype).transpose(1, 2), g) if need_b else None
    else:
        raise NotImplementedError(f"no gradient for semiring id {ctx.semiring_id}")
    return (ga.to(a.dtype) if need_a else None, gb.to(b.dtype) if need_b else None, None, None)


def _selection_backward(a, b, out, arg, grad_out, semiring_id):
    """max / min: route each output's gradient to its selected k; none where out is the semiring zero."""
    B, n, k = a.shape
    m = b.shape[2]
    acc = accumulation_dtype(a.dtype)
    if k == 0:
        return a.new_zeros((B, n, 0), dtype=acc), b.new_zeros((B, 0, m), dtype=acc)
    if arg.numel() != out.numel():  # forward ran without arg tracking: recompute it
        out, arg = bmm_forward(a.detach(), b.detach(), semiring_id, True)
    # 6 launches (a where against a fresh scalar tensor and out-of-place scatter_adds took 9: at n = 64 the
    # backward is launch-bound)
    g = grad_out.to(acc).masked_fill(out == _ZERO[semiring_id], 0.0)
    ga = torch.zeros((B, n, k), dtype=acc, device=a.device).scatter_add_(2, arg, g)
    gb = torch.zeros((B, k, m), dtype=acc, device=b.device).scatter_add_(1, arg, g)
    return ga, gb


bmm_forward.register_autograd(_bmm_backward, setup_context=_bmm_setup_context)


def plain_eager(*tensors: Tensor | None) -> bool:
    """Whether a call on these tensors may skip the custom ops' Python dispatch (~8 µs a call on the CPU
    host, more on a GPU machine's): outside torch.compile and dispatch modes, on plain tensors (no tensor
    subclass, no functorch wrapper, no batched tensor of the legacy vmap that gradcheck uses). Recording a
    graph is the caller's concern."""
    if torch.compiler.is_compiling() or _dispatch_stack_len() > 0:
        return False
    for t in tensors:  # a loop, not all(...) over a generator: half the cost (~0.5 us) on the hot path
        if t is not None and (type(t) not in _PLAIN or _is_functorch_wrapped(t) or _is_legacy_batched(t)):
            return False
    return True


_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_is_legacy_batched = torch._C._functorch.is_legacy_batchedtensor
_PLAIN = (Tensor, torch.nn.Parameter)  # a Parameter is a subclass that changes no operator


def eager_function(
    name: str, body: Callable[..., Any], setup_context: Callable[..., None], backward: Callable[..., Any]
) -> type[torch.autograd.Function]:
    """An autograd.Function running a registered op's ``body`` with the op's own autograd formula
    (``setup_context(ctx, inputs, output)``, ``backward(ctx, *grads)``) but without the op's Python dispatch: for
    plain eager tensors (plain_eager) where no C++ node is had (the PyTorch reference; on the CPU, while a family's
    autograd module is built in the background). The op's dispatch costs ~8 us a call, and its first call imports
    torch._dynamo (~3.7 s on the 2-core machine, inside a first logbmm)."""

    def forward(ctx: Any, *inputs: Any) -> Any:
        output = body(*inputs)
        setup_context(ctx, inputs, output)
        return output

    attributes = {"forward": staticmethod(forward), "backward": staticmethod(backward), "__module__": __name__}
    return type(name, (torch.autograd.Function,), attributes)


_BmmEager = eager_function(
    "_BmmEager",
    lambda a, b, semiring_id, with_arg: tuple(backend_for(a.device).bmm_forward(a, b, semiring_id, with_arg)),
    _bmm_setup_context,
    _bmm_backward,
)


def bmm_forward_eager(a: Tensor, b: Tensor, semiring_id: int, with_arg: bool) -> tuple[Tensor, Tensor]:
    """bmm_forward without the custom op's Python dispatch on plain eager tensors (plain_eager): recorded for
    autograd by the bmm family's C++ node when a gradient is needed (csrc/autograd: no Python between the
    kernels in a forward + backward), or by _BmmEager where there is no node; else the kernel directly; anything
    else goes through the registered op."""
    if not plain_eager(a, b):
        return bmm_forward(a, b, semiring_id, with_arg)
    backend = backend_for(a.device)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        node = backend.autograd_node("bmm", "bmm_autograd")
        if node is None:
            return _BmmEager.apply(a, b, semiring_id, with_arg)
        return tuple(node(a, b, semiring_id, with_arg))
    return tuple(backend.bmm_forward(a, b, semiring_id, with_arg))


# ---------------------------------------------------------------- log_bmm_backward


def _neg_log_norm(c: Tensor) -> Tensor:
    """-c, except -inf where c is -inf: a fully -inf output then weighs every term by exp(-inf) = 0."""
    return torch.where(c == -math.inf, c, -c)


def _log_bmm_grads(a: Tensor, b: Tensor, c: Tensor, g: Tensor, need_a: bool, need_b: bool) -> tuple[Tensor, Tensor]:
    """log_bmm_backward's body: the backend's log_bmm_grads (one pass on the CPU, two log_contracts on CUDA)."""
    acc = c.dtype
    ga, gb = backend_for(c.device).log_bmm_grads(a.to(acc), b.to(acc), c, g.to(acc), need_a, need_b)
    # an unneeded gradient is its own empty tensor: an operator's outputs may not share storage
    return ga, gb


@torch.library.custom_op("semiring_ops::log_bmm_backward", mutates_args=())
def log_bmm_backward(a: Tensor, b: Tensor, c: Tensor, g: Tensor, need_a: bool, need_b: bool) -> tuple[Tensor, Tensor]:
    """Gradient of c = logbmm(a, b) given dL/dc = g; tensors a (B,n,k), b (B,k,m), c and g (B,n,m).

    Returns (grad_a (B,n,k), grad_b (B,k,m)) in c's dtype; an unneeded one is an empty (0,) tensor.
    """
    return _log_bmm_grads(a, b, c, g, need_a, need_b)


def log_bmm_backward_eager(a, b, c, g, need_a: bool, need_b: bool) -> tuple[Tensor, Tensor]:
    """log_bmm_backward, calling its body directly when no graph is recorded (no double backward) on
    plain eager tensors."""
    recording = torch.is_grad_enabled() and any(t.requires_grad for t in (a, b, c, g))
    if recording or not plain_eager(a, b, c, g):
        return log_bmm_backward(a, b, c, g, need_a, need_b)
    return _log_bmm_grads(a, b, c, g, need_a, need_b)


@log_bmm_backward.register_fake
def _(a, b, c, g, need_a, need_b):
    ga = c.new_empty(a.shape if need_a else (0,))
    gb = c.new_empty(b.shape if need_b else (0,))
    return ga, gb


def _log_bwd_setup_context(ctx, inputs, output):
    a, b, c, g, need_a, need_b = inputs
    ga, gb = output
    ctx.need = (need_a, need_b)
    ctx.save_for_backward(a, b, c, g, ga, gb)


def _log_bwd_backward(ctx, u, v):
    """Second derivatives. With P_ikj = exp(a_ik + b_kj - c_ij) and L = <u, ga> + <v, gb>:
    dL/dg_ij = sum_k P (u_ik + v_kj);  dL/dc_ij = -g_ij dL/dg_ij;
    dL/da_ik = u_ik ga_ik + sum_j P g_ij v_kj;  dL/db_kj = v_kj gb_kj + sum_i P g_ij u_ik.
    """
    a, b, c, g, ga, gb = ctx.saved_tensors
    acc = c.dtype
    u = u if (u is not None and ctx.need[0]) else None
    v = v if (v is not None and ctx.need[1]) else None
    a_acc, b_acc, g_acc = a.to(acc), b.to(acc), g.to(acc)
    negc = _neg_log_norm(c)
    zeros = (torch.zeros_like(a_acc), torch.zeros_like(b_acc), torch.zeros_like(c))
    d_a, d_b, d_g = zeros
    if u is not None:
        d_g = d_g + log_contract(a_acc, u, b_acc, None, negc)
        d_a = d_a + u * ga
        d_b = d_b + log_contract(a_acc.transpose(1, 2), u.transpose(1, 2), negc, g_acc, b_acc)
    if v is not None:
        d_g = d_g + log_contract(a_acc, None, b_acc, v, negc)
        d_b = d_b + v * gb
        d_a = d_a + log_contract(negc, g_acc, b_acc.transpose(1, 2), v.transpose(1, 2), a_acc)
    d_c = -g_acc * d_g
    needs = ctx.needs_input_grad
    return (
        d_a.to(a.dtype) if needs[0] else None,
        d_b.to(b.dtype) if needs[1] else None,
        d_c if needs[2] else None,
        d_g.to(g.dtype) if needs[3] else None,
        None,
        None,
    )


log_bmm_backward.register_autograd(_log_bwd_backward, setup_context=_log_bwd_setup_context)
