"""trainer.compile_loss: the chunked loss's elementwise passes as one compiled function
(align/objectives/ce.py `chunk_terms`) give the eager chunked loss's value and gradients, go through
dynamo every chunk, and compile one graph for every chunk height; auto follows trainer.compile."""

from __future__ import annotations

import pytest
import torch

from align.config import to_typed
from align.objectives.ce import ChunkedCE, compiled_chunk_terms
from align.plan.compile_auto import resolve_compile
from align.run.cli import compose


class Counting:
    """A dynamo backend that runs the graph as traced and counts the graphs it is handed."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def _head(vocab: int = 97, dim: int = 12, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(dim, vocab, bias=False)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_the_compiled_passes_give_the_eager_chunked_loss_and_gradients(softcap):
    head = _head()
    hidden = torch.randn(23, 12)  # chunks of 8, 8 and 7: a ragged last chunk
    labels = torch.randint(0, 97, (23,))
    labels[4] = -100  # a position without a target is left out of both
    got_grads, losses = [], []
    for compiled in (False, True):
        head.weight.grad = None
        h = hidden.clone().requires_grad_()
        loss = ChunkedCE(head, 8, softcap, compiled=compiled, backend="eager")(h, labels)
        (1.5 * loss).backward()
        losses.append(loss)
        got_grads.append((h.grad, head.weight.grad.clone()))
    close = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses[1], losses[0], **close)
    for a, b in zip(got_grads[1], got_grads[0]):
        torch.testing.assert_close(a, b, **close)
    with torch.no_grad():  # an eval forward: the loss alone
        torch.testing.assert_close(ChunkedCE(head, 8, softcap, compiled=True, backend="eager")(hidden, labels),
                                   losses[0].detach(), **close)


def test_every_chunk_goes_through_one_dynamic_graph():
    torch._dynamo.reset()  # dynamo keeps what it learned of chunk_terms' sizes per code object, across backends
    backend = Counting()
    loss_fn = ChunkedCE(_head(), 8, 2.0, compiled=True, backend=backend)
    assert loss_fn.fused is compiled_chunk_terms(backend)  # compiled once per backend for the process
    for n in (23, 30, 21):  # cut by 8: chunks of 8 and 7; 8 and 6; 8 and 5
        h = torch.randn(n, 12, requires_grad=True)
        loss_fn(h, torch.randint(0, 97, (n,))).backward()
    # the rows are marked dynamic from the first call: one graph for every height (a static first graph
    # turned dynamic at the first new height would be two)
    assert backend.graphs == 1


def test_the_trainer_trains_through_the_compiled_loss(tmp_path, monkeypatch):
    from align.objectives import ce, sft
    from tests.conftest import build_trainer

    backend = Counting()

    class Eager(ce.ChunkedCE):  # the CPU suite traces with a counting backend instead of inductor
        def __init__(self, *a, **k):
            super().__init__(*a, **k, backend=backend)

    monkeypatch.setattr(sft, "ChunkedCE", Eager)
    trainer = build_trainer(tmp_path, "trainer.max_steps=1", "trainer.export=false", "data.max_records=16",
                            "trainer.loss_chunk_tokens=16", "trainer.compile_loss=true")
    assert trainer.fit() == 0
    assert backend.graphs >= 1 and trainer.model_info["loss"]["compiled"] is True


def _typed(*overrides: str):
    return to_typed(compose(["logger=none", *overrides]))


def test_auto_follows_the_blocks_and_an_explicit_switch_is_kept():
    cfg = _typed()
    assert cfg.trainer.compile_loss == "auto"
    on, rec = resolve_compile(cfg, "cuda")
    assert on.trainer.compile_loss is True and rec["loss"]["resolved"] is True
    assert "follows trainer.compile (resolved on)" in rec["loss"]["why"]
    off, rec = resolve_compile(cfg, "cpu")
    assert off.trainer.compile_loss is False and "resolved off" in rec["loss"]["why"]
    kept, rec = resolve_compile(_typed("trainer.compile_loss=false"), "cuda")
    assert kept.trainer.compile is True and kept.trainer.compile_loss is False
    assert rec["loss"]["why"] == "trainer.compile_loss=false as configured"


def test_the_sft_objective_builds_the_compiled_loss_only_when_resolved_on():
    from align.objectives import build_objective

    cfg = _typed("trainer.loss_chunk_tokens=16")
    with pytest.raises(ValueError, match="compile_loss='auto' reached the objective unresolved"):
        build_objective(cfg)
    for device, want in (("cuda", True), ("cpu", False)):
        assert build_objective(resolve_compile(cfg, device)[0]).compiled is want


def test_the_head_runs_in_the_runs_autocast_dtype_as_the_full_logits_path(tmp_path, monkeypatch):
    """The chunked loss runs outside the forward's autocast: fp32 hidden states must still reach the
    head's GEMM in bf16 under precision=bf16, as full logits computed inside the autocast do."""
    from align.objectives import ce
    from tests.conftest import build_trainer

    seen = []

    class Spy:  # torch.nn.functional as ce.py sees it, its linear recording the dtypes it is handed
        def __getattr__(self, name):
            return getattr(torch.nn.functional, name)

        def linear(self, x, w, *a):
            seen.append((x.dtype, w.dtype))
            return torch.nn.functional.linear(x, w, *a)

    monkeypatch.setattr(ce, "F", Spy())
    trainer = build_trainer(tmp_path, "trainer.max_steps=1", "trainer.export=false", "data.max_records=16",
                            "trainer.loss_chunk_tokens=16", "trainer.precision=bf16")
    assert trainer.fit() == 0
    assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16)}
