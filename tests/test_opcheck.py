"""torch.library.opcheck of every registered semiring_ops operator, on each device and backend (the compiled
kernels and the PyTorch reference): the schema (no output may alias an input or another output: torch.compile
and torch.export reject such an op, as chain_log_backward's CUDA outputs once were, views of one buffer), the
fake implementation against the real one, the autograd registration, and AOT dispatch with dynamic shapes.
The lazy reductions' operator has its own opcheck in test_lazy_compile.py."""

from __future__ import annotations

import pytest
import torch

from semiring_ops.ops import chain_ops, registry
from semiring_ops.semirings import SEMIRINGS

LOG, MAX, MIN, STD = (SEMIRINGS[name].kernel_id for name in ("log", "max", "min", "std"))


def _chain_args(device, B: int, T: int, C: int, seed: int):
    """em (B, T, C) float64 requiring grad, transitions, start, end (requiring grad), lengths (B,) in 0..T."""
    g = torch.Generator().manual_seed(seed)

    def param(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device).requires_grad_()

    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = T
    return param(B, T, C), param(C, C), param(C), param(C), lengths.to(device)


@pytest.mark.parametrize("semiring_id", [LOG, MAX, MIN, STD])
@pytest.mark.parametrize("with_arg", [False, True])
def test_bmm_forward(impl, device, semiring_id, with_arg):
    g = torch.Generator().manual_seed(semiring_id)
    a = torch.randn(2, 5, 7, generator=g, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(2, 7, 3, generator=g, dtype=torch.float64).to(device).requires_grad_()
    torch.library.opcheck(registry.bmm_forward, (a, b, semiring_id, with_arg))


@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True), (False, False)])
def test_log_bmm_backward(impl, device, need):
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(*s, generator=g, dtype=torch.float64).to(device) for s in ((2, 5, 7), (2, 7, 3)))
    c = torch.logsumexp(a[..., :, :, None] + b[..., None, :, :], dim=-2)
    grad = torch.randn(c.shape, generator=g, dtype=torch.float64).to(device)
    torch.library.opcheck(registry.log_bmm_backward, (a, b, c, grad, *need))


def test_log_contract(impl, device):
    g = torch.Generator().manual_seed(4)
    l0, l1 = (torch.randn(2, 4, 6, generator=g, dtype=torch.float64).to(device) for _ in range(2))
    r0, r1 = (torch.randn(2, 6, 5, generator=g, dtype=torch.float64).to(device) for _ in range(2))
    o0 = torch.randn(2, 4, 5, generator=g, dtype=torch.float64).to(device)
    torch.library.opcheck(registry.log_contract, (l0, l1, r0, r1, o0))
    torch.library.opcheck(registry.log_contract, (l0, None, r0, None, o0))


# C = 260 on the GPU: the transition matrix and pair marginals leave the block (a cluster of blocks, or the
# off-chip pair-marginal sum), the path whose outputs once shared a buffer
CHAIN_SIZES = [(3, 5, 4), (2, 4, 260)]


@pytest.mark.parametrize(("B", "T", "C"), CHAIN_SIZES)
@pytest.mark.parametrize("with_tags", [False, True])
def test_chain_log_backward(impl, device, B, T, C, with_tags):
    em, trans, start, end, lengths = (t.detach() for t in _chain_args(device, B, T, C, seed=C))
    tags = torch.randint(0, C, (B, T), generator=torch.Generator().manual_seed(1)).to(device)
    if with_tags:
        _llh, alpha, log_z = chain_ops.crf_log_likelihood(em, trans, start, end, lengths, tags)
    else:
        log_z, alpha = chain_ops.chain_scan(em, trans, start, end, lengths, LOG, False, True)
    grad = torch.rand(B, dtype=torch.float64).to(device)
    args = (em, trans, start, end, lengths, alpha, log_z, grad, tags if with_tags else None)
    torch.library.opcheck(chain_ops.chain_log_backward, args)


@pytest.mark.parametrize(("B", "T", "C"), CHAIN_SIZES)
def test_chain_scan_and_crf_log_likelihood(impl, device, B, T, C):
    args = _chain_args(device, B, T, C, seed=B)
    tags = torch.randint(0, C, (B, T), generator=torch.Generator().manual_seed(2)).to(device)
    torch.library.opcheck(chain_ops.crf_log_likelihood, (*args, tags))
    torch.library.opcheck(chain_ops.chain_scan, (*args, LOG, False, True))  # the differentiable scan
    detached = tuple(t.detach() for t in args)  # the others have no gradient
    for semiring_id, reverse, save_scores in ((LOG, True, False), (LOG, False, False), (MAX, False, True)):
        torch.library.opcheck(chain_ops.chain_scan, (*detached, semiring_id, reverse, save_scores))


@pytest.mark.parametrize("semiring_id", [MAX, MIN])
def test_chain_viterbi(impl, device, semiring_id):
    args = tuple(t.detach() for t in _chain_args(device, 3, 6, 5, seed=semiring_id))
    torch.library.opcheck(chain_ops.chain_viterbi, (*args, semiring_id))


@pytest.mark.parametrize("given", ["mask", "lengths"])
@pytest.mark.parametrize("raise_errors", [True, False])
def test_sequence_lengths(impl, device, given, raise_errors):
    B, T, C = 4, 6, 3
    lengths = torch.tensor([6, 0, 3, 5], device=device)
    mask = torch.arange(T, device=device)[None, :] < lengths[:, None]
    tags = torch.randint(0, C, (B, T), generator=torch.Generator().manual_seed(0)).to(device)
    inputs = (mask, None) if given == "mask" else (None, lengths)
    torch.library.opcheck(chain_ops.sequence_lengths, (*inputs, tags, B, T, C, raise_errors))


@pytest.mark.cuda
def test_log_bmm_fast():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from semiring_ops.ops import fast_log

    g = torch.Generator().manual_seed(6)
    a = torch.randn(2, 33, 40, generator=g).cuda().requires_grad_()
    b = torch.randn(2, 40, 17, generator=g).cuda().requires_grad_()
    for passes in (1, 3):
        torch.library.opcheck(fast_log.log_bmm_fast_op, (a, b, passes))
