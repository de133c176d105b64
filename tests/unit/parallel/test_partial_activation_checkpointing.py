"""parallel.activation_checkpointing_fraction: only the chosen decoder blocks recompute in backward,
the gradients are those of no checkpointing, and the manifest records the blocks that recomputed."""

from __future__ import annotations

import pytest
import torch

from align.config import ParallelConfig, to_typed
from align.errors import ConfigError
from align.parallel.env import DistEnv
from align.parallel.wrap import checkpointed_indices, parallelize

ENV = DistEnv(rank=0, world=1, local_rank=0, device=torch.device("cpu"))


def _mistral(layers: int = 4, seed: int = 0):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    return MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2))


def _ac(fraction: float) -> ParallelConfig:
    return ParallelConfig(activation_checkpointing=True, activation_checkpointing_fraction=fraction)


def _step(model) -> None:
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()


def _attention_calls(model) -> list[int]:
    """Calls of each block's attention over the step. The checkpoint wraps the block's forward, not its
    __call__ (transformers keeps hooks outside it), so a hook on the block itself would count once: the
    recompute shows on the modules inside it."""
    calls = [0] * len(model.model.layers)
    for i, block in enumerate(model.model.layers):
        block.self_attn.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


def test_blocks_are_spread_evenly_over_depth():
    assert checkpointed_indices(4, 0.5) == [0, 2]
    assert checkpointed_indices(16, 0.5) == list(range(0, 16, 2))
    assert checkpointed_indices(16, 0.25) == [0, 4, 8, 12]
    assert checkpointed_indices(5, 0.5) == [0, 1, 3]  # floor(2.5 + 0.5) = 3 blocks
    assert checkpointed_indices(4, 1.0) == [0, 1, 2, 3]
    assert checkpointed_indices(16, 0.01) == [0]  # at least one: checkpointing was asked for


@pytest.mark.parametrize("fraction, chosen", [(0.5, [0, 2]), (0.25, [0]), (1.0, [0, 1, 2, 3])])
def test_exactly_the_chosen_blocks_recompute_and_the_info_names_them(fraction, chosen):
    model = _mistral()
    info = parallelize(model, _ac(fraction), ENV)
    calls = _attention_calls(model)
    _step(model)
    assert calls == [2 if i in chosen else 1 for i in range(4)]
    assert info["activation_checkpointing_blocks"] == chosen == [i for i, c in enumerate(calls) if c == 2]
    assert info["activation_checkpointing_block_count"] == len(chosen) and info["decoder_blocks"] == 4
    assert info["activation_checkpointing_fraction"] == fraction
    assert info["activation_checkpointing"] in ("activation_checkpointing_enable", "gradient_checkpointing_enable")


def test_no_checkpointing_records_no_blocks():
    model = _mistral()
    info = parallelize(model, ParallelConfig(), ENV)
    calls = _attention_calls(model)
    _step(model)
    assert calls == [1, 1, 1, 1]
    assert info["activation_checkpointing"] is None and info["activation_checkpointing_blocks"] == []


def test_partial_checkpointing_changes_no_gradient():
    grads = []
    for cfg in (ParallelConfig(), _ac(0.5)):
        model = _mistral(seed=3)
        parallelize(model, cfg, ENV)
        _step(model)
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-6, atol=1e-7, msg=name)


class _Block(torch.nn.Module):  # a decoder block without transformers' per-block switch
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)


class _OldStyleModel(torch.nn.Module):
    _no_split_modules = ["_Block"]

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Block(), _Block()])
        self.enabled = False

    def activation_checkpointing_enable(self, **_):
        self.enabled = True


def test_a_fraction_is_refused_where_blocks_have_no_per_block_switch():
    model = _OldStyleModel()
    with pytest.raises(ConfigError,
                       match=r"^parallel.activation_checkpointing_fraction: .*GradientCheckpointingLayer.*_Block"):
        parallelize(model, _ac(0.5), ENV)
    assert not model.enabled  # refused before anything was switched on
    info = parallelize(model, _ac(1.0), ENV)  # all blocks: the model's own mechanism, as before
    assert model.enabled and info["activation_checkpointing_blocks"] is None


def test_preflight_refuses_the_fraction_on_such_a_model_before_building(compose, monkeypatch):
    from align.plan import memory
    from align.run.preflight_checks import run_preflight

    monkeypatch.setattr(memory, "meta_model", lambda cfg: (_OldStyleModel(), None))
    cfg = to_typed(compose(["allow_dirty=true", "parallel.activation_checkpointing=true",
                            "parallel.activation_checkpointing_fraction=0.5"]))
    with pytest.raises(ConfigError, match=r"^parallel.activation_checkpointing_fraction: .*GradientCheckpointingLayer"):
        run_preflight(cfg)


@pytest.mark.parametrize("overrides", [
    ["parallel.activation_checkpointing=true", "parallel.activation_checkpointing_fraction=0"],
    ["parallel.activation_checkpointing=true", "parallel.activation_checkpointing_fraction=1.5"],
    ["parallel.activation_checkpointing=true", "parallel.activation_checkpointing_fraction=-0.5"],
    ["parallel.activation_checkpointing=true", "parallel.activation_checkpointing_fraction=nan"],
    ["parallel.activation_checkpointing_fraction=0.5"],  # without checkpointing it would do nothing
])
def test_bad_fractions_exit_2_with_one_line_naming_the_key(overrides, capsys):
    from align.run.cli import validate_command_line

    with pytest.raises(SystemExit) as e:
        validate_command_line(overrides)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "parallel.activation_checkpointing_fraction" in err[0], err


def test_the_manifest_records_the_blocks_that_recompute(tmp_path, compose):
    """Through RunRecord and Trainer.build: provenance.json's model.extra.parallel names exactly the
    blocks whose attention runs again in backward."""
    from omegaconf import OmegaConf

    from align.parallel.fsdp import decoder_blocks
    from align.run.manifest import load
    from align.run.record import RunRecord
    from align.trainer import Trainer

    ov = ["logger=none", "data.max_records=24", "trainer.max_steps=1", "allow_dirty=true",
          "parallel.activation_checkpointing=true", "parallel.activation_checkpointing_fraction=0.5"]
    cfg = compose(ov)
    typed, run_dir = to_typed(cfg), tmp_path / "run"
    record = RunRecord(typed, OmegaConf.to_container(cfg, resolve=True), run_dir, ov, ov)
    with record:
        record.start([])
        t = Trainer.build(typed, run_dir)
        record.built(t)
        record.finished(t, 0)
    manifest = load(run_dir)["model"]["extra"]["parallel"]

    layers = t.model.config.num_hidden_layers
    calls = [0] * layers
    for i, block in enumerate(decoder_blocks(t.model)):
        block.self_attn.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    b = next(iter(t.stream))
    assert torch.isfinite(t.forward_backward(b.to(t.env.device), 1.0))
    recomputed = [i for i, c in enumerate(calls) if c == 2]
    assert sorted(set(calls)) == [1, 2], calls
    assert manifest["activation_checkpointing_blocks"] == recomputed == checkpointed_indices(layers, 0.5)
    assert manifest["activation_checkpointing_fraction"] == 0.5 and manifest["decoder_blocks"] == layers
