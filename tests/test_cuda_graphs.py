"""CUDA graph capture of a CRF train step and decode: nothing synchronises with the host under capture (the
one round trip that validates masks, lengths and tags becomes device-side marking), replays match eager
calls, and bad input given to a replay makes that sequence's results NaN instead of raising."""

from __future__ import annotations

import pytest
import torch

from semiring_ops.structures import LinearChainCRF

pytestmark = pytest.mark.cuda


def _capture(fn):
    """Warm up fn on a side stream (as torch.cuda.graph asks), then capture one call -> (graph, output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.fixture
def crf_inputs():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    B, T, C = 5, 9, 6
    g = torch.Generator().manual_seed(5)
    crf = LinearChainCRF(C, batch_first=True).cuda()
    em = torch.randn(B, T, C, generator=g).cuda().requires_grad_()
    tags = torch.randint(0, C, (B, T), generator=g).cuda()
    lengths = torch.tensor([9, 4, 1, 9, 6])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).cuda()
    return crf, em, tags, mask


def _eager_step(crf, em, tags, mask):
    crf.zero_grad(set_to_none=True)
    e = em.detach().clone().requires_grad_()
    loss = crf.nll(e, tags, mask)
    loss.backward()
    return loss.detach(), e.grad, crf.transitions.grad.clone()


def test_train_step_replays_match_eager_and_bad_input_gives_nan(crf_inputs):
    crf, em, tags, mask = crf_inputs
    C = crf.num_tags

    def step():
        em.grad = None
        crf.zero_grad(set_to_none=True)
        loss = crf.nll(em, tags, mask)
        loss.backward()
        return loss

    graph, loss = _capture(step)
    em_grad, trans_grad = em.grad, crf.transitions.grad  # the graph's own tensors, refilled by each replay
    for seed in (1, 2):  # new emissions copied into the captured input, then a replay
        em.data.copy_(torch.randn(em.shape, generator=torch.Generator().manual_seed(seed)).cuda())
        graph.replay()
        want_loss, want_em, want_trans = _eager_step(crf, em, tags, mask)
        torch.testing.assert_close(loss, want_loss)
        torch.testing.assert_close(em_grad, want_em)
        torch.testing.assert_close(trans_grad, want_trans)

    tags[1, 2] = C + 3  # a bad tag below sequence 1's length: eager raises, a replay gives NaN
    with pytest.raises(ValueError, match="tags must lie"):
        crf.nll(em, tags, mask)
    graph.replay()
    assert loss.isnan()
    assert em_grad[1].isnan().all() and torch.isfinite(em_grad[[0, 2, 3, 4]]).all()
    assert torch.isfinite(trans_grad).all()
    tags[1, 2] = 0
    mask[3, 2] = False  # a hole in sequence 3's mask
    graph.replay()
    assert loss.isnan() and em_grad[3].isnan().all() and torch.isfinite(em_grad[[0, 1, 2, 4]]).all()


def test_decode_replays_match_eager(crf_inputs):
    crf, em, _, mask = crf_inputs

    def decode():
        with torch.no_grad():
            return crf.viterbi(em, mask)

    graph, (path, score) = _capture(decode)
    em.data.copy_(torch.randn(em.shape, generator=torch.Generator().manual_seed(3)).cuda())
    graph.replay()
    want_path, want_score = decode()
    assert torch.equal(path, want_path)
    torch.testing.assert_close(score, want_score)
    mask[0, 3] = False  # a hole: that sequence's score is NaN and its tags -1
    graph.replay()
    assert score[0].isnan() and (path[0] == -1).all() and torch.equal(path[1:], want_path[1:])


@pytest.mark.parametrize("validate", [True, False])
def test_validate_false_drops_the_only_synchronisation_of_an_eager_step(crf_inputs, validate):
    """Under torch.cuda.set_sync_debug_mode("error") a synchronising call raises: the default train step
    and decode synchronise once each (validation), with validate=False they do not at all."""
    crf, em, tags, mask = crf_inputs
    crf.validate = validate

    def step():
        crf.nll(em, tags, mask).backward()
        return crf.viterbi(em, mask)

    step()  # kernels built and loaded before the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        if validate:
            with pytest.raises(RuntimeError, match="synchroniz"):
                step()
        else:
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_torch_compile_reduce_overhead_of_a_train_step_matches_eager(crf_inputs):
    """mode="reduce-overhead" (inductor's CUDA graphs over the compiled forward and backward): the CRF's ops
    run as registered custom ops, warm-up calls validate as eager does, the captured ones mark instead of
    synchronising; every call with new emissions matches the eager step."""
    crf, em, tags, mask = crf_inputs
    torch._dynamo.reset()
    loss_fn = torch.compile(lambda e: crf.nll(e, tags, mask), mode="reduce-overhead", fullgraph=True)
    for seed in range(5):  # warm-up, capture, replays
        e = torch.randn(em.shape, generator=torch.Generator().manual_seed(seed)).cuda().requires_grad_()
        crf.zero_grad(set_to_none=True)
        loss = loss_fn(e)
        loss.backward()
        got = (loss.detach().clone(), e.grad.clone(), crf.transitions.grad.clone())
        for g, w in zip(got, _eager_step(crf, e, tags, mask), strict=True):
            torch.testing.assert_close(g, w)
