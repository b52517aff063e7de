"""torch.compile and torch.export of LinearChainCRF training and decoding (the supported routes; torch.jit.script
is deprecated by PyTorch and the module is not scriptable), against the same calls run eagerly: a train step
(emissions from an nn.Linear, loss = -crf(em, tags, mask), backward, optimizer step) compiled with
fullgraph=True in the default mode and in mode="reduce-overhead" (CUDA graphs on a GPU) over several steps of
new inputs, two shapes; nn.Modules whose forward calls the CRF loss or viterbi, exported with a dynamic batch
and length and run on fresh inputs; and the example of docs/structures.md, run as written there."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn
from torch.export import Dim

from semiring_ops.structures import LinearChainCRF

FEATURES, C = 6, 5
TOL = {"rtol": 1e-4, "atol": 1e-5}  # float32; inductor fuses the linear layer's ops differently from eager
DOCS = Path(__file__).resolve().parents[1] / "docs" / "structures.md"


class Tagger(nn.Module):
    """Emissions from a linear layer, then the CRF: forward gives the per-sequence loss (B,)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(FEATURES, C)
        self.crf = LinearChainCRF(C, batch_first=True)
        with torch.no_grad():  # transitions far from uniform, so that they matter
            self.crf.transitions.normal_()

    def forward(self, x: Tensor, tags: Tensor, mask: Tensor) -> Tensor:
        return -self.crf(self.lin(x), tags, mask, reduction="none")


class Decoder(Tagger):
    """The same layers; forward gives the best paths: tags (B, T), -1 padded, and their scores (B,)."""

    def forward(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return self.crf.viterbi(self.lin(x), mask)


def _batch(seed: int, B: int, T: int, device: str) -> tuple[Tensor, Tensor, Tensor]:
    """x (B, T, FEATURES), tags (B, T), a prefix mask (B, T) with lengths 0..T (the first T, the second 0)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, FEATURES, generator=g)
    tags = torch.randint(0, C, (B, T), generator=g)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0], lengths[1] = T, 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return x.to(device), tags.to(device), mask.to(device)


def _train_step(model: Tagger, loss_fn, opt: torch.optim.Optimizer, batch) -> tuple[Tensor, dict[str, Tensor]]:
    """One step -> (the loss, each parameter's gradient), copied before anything can overwrite them."""
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(*batch).sum()
    loss.backward()
    out = loss.detach().clone(), {name: p.grad.clone() for name, p in model.named_parameters()}
    opt.step()
    return out


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_train_step_matches_eager(device, mode):
    """The loss compiled with fullgraph=True (no graph break anywhere in the CRF), its backward the compiled
    backward; the optimizer step stays eager (torch.optim's step breaks the graph on purpose, so a whole step
    cannot be one fullgraph). Five steps of new inputs, the last two of another shape: the same losses,
    gradients and parameters as eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = Tagger().to(device)
    compiled = copy.deepcopy(eager)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    opt_compiled = torch.optim.SGD(compiled.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.compile(compiled, mode=mode, fullgraph=True)
    for step, (B, T) in enumerate([(4, 7)] * 3 + [(3, 5)] * 2):
        batch = _batch(step, B, T, device)
        want_loss, want_grads = _train_step(eager, eager, opt_eager, batch)
        loss, grads = _train_step(compiled, loss_fn, opt_compiled, batch)
        torch.testing.assert_close(loss, want_loss, **TOL, msg=f"loss, step {step}")
        for name, g in grads.items():
            torch.testing.assert_close(g, want_grads[name], **TOL, msg=f"d/d {name}, step {step}")
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOL, msg=name)


def _dynamic(*tensors: Tensor) -> tuple[dict[int, Dim], ...]:
    """Every input's first two dimensions (batch, steps) dynamic."""
    batch, steps = Dim("batch", min=1), Dim("steps", min=1)
    return tuple({0: batch, 1: steps} for _ in tensors)


def test_exported_loss_matches_eager_on_fresh_inputs(device):
    """torch.export of a module whose forward is the CRF loss: the exported program, run on inputs of other
    shapes than it was traced with, gives eager's loss and, through the CRF ops' registered gradients, eager's
    gradients."""
    torch.manual_seed(1)
    model = Tagger().to(device)
    example = _batch(0, 3, 6, device)
    program = torch.export.export(model, example, dynamic_shapes=_dynamic(*example))
    assert "semiring_ops.crf_log_likelihood" in program.graph_module.code  # the fused loss, not a decomposition
    exported = program.module()
    for seed, (B, T) in enumerate([(3, 6), (5, 9), (2, 1)], start=1):
        batch = _batch(seed, B, T, device)
        got = exported(*batch)
        want = model(*batch)
        torch.testing.assert_close(got, want, **TOL)
        got_grads = torch.autograd.grad(got.sum(), list(exported.parameters()))
        want_grads = torch.autograd.grad(want.sum(), list(model.parameters()))
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, **TOL)


def test_exported_viterbi_matches_eager_on_fresh_inputs(device):
    torch.manual_seed(2)
    model = Decoder().to(device)
    x, _, mask = _batch(0, 3, 6, device)
    program = torch.export.export(model, (x, mask), dynamic_shapes=_dynamic(x, mask))
    assert "semiring_ops.chain_viterbi" in program.graph_module.code
    exported = program.module()
    for seed, (B, T) in enumerate([(3, 6), (5, 9), (2, 1)], start=1):
        x, _, mask = _batch(seed, B, T, device)
        tags, scores = exported(x, mask)
        want_tags, want_scores = model(x, mask)
        assert torch.equal(tags, want_tags)
        torch.testing.assert_close(scores, want_scores, **TOL)


def test_the_docs_example(tmp_path, monkeypatch):
    """The code block under "TorchScript, torch.compile and torch.export" in docs/structures.md, run as written
    (in a scratch folder: it saves a file), and what it computes checked against eager calls."""
    text = DOCS.read_text()
    found = re.search(r"<!-- tested: tests/test_crf_compile.py -->\n```python\n(.*?)```", text, re.DOTALL)
    assert found, f"no tested example in {DOCS}"
    monkeypatch.chdir(tmp_path)
    torch._dynamo.reset()
    scope: dict = {}
    exec(compile(found.group(1), str(DOCS), "exec"), scope)
    model, words, mask = scope["model"], scope["words"], scope["mask"]
    want_tags, want_scores = model(words, mask)
    assert torch.equal(scope["tags"], want_tags)
    torch.testing.assert_close(scope["scores"], want_scores)
    want_loss = model.crf.nll(model.emissions(words), scope["gold"], mask)
    torch.testing.assert_close(scope["loss"], want_loss)
