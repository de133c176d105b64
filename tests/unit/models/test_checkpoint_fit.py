"""A checkpoint that does not fit the model is refused, never trained from random weights: config.json's
model_type and architectures against the family before any weight (align.models.checkpoint_fit.family_problem,
in preflight and in the build), transformers' load report after the load (load_checked), and a torch pickle
the weights-only loader refuses named by file. Tiny checkpoints are written from configs, then broken."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from align.config import Family
from align.errors import ConfigError
from align.models.checkpoint_fit import family_problem
from align.models.family_table import FAMILIES
from tests.conftest import tiny_checkpoint, tiny_hf_checkpoint


def _edit_config(d: Path, **changes) -> None:
    config = json.loads((d / "config.json").read_text())
    config.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        config.pop(k)
    (d / "config.json").write_text(json.dumps(config))


def _edit_tensors(d: Path, edit) -> None:
    tensors = load_file(d / "model.safetensors")
    edit(tensors)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


# ----------------------------------------------------------------------------- before the load


def test_each_familys_own_checkpoint_fits_and_another_familys_names_the_option_that_loads_it(tmp_path):
    for family in FAMILIES:
        own = tiny_checkpoint(tmp_path / family.value, family)
        assert family_problem(family, own) is None and family_problem(Family.hf, own) is None, family
    gemma_moe, gemma = tmp_path / "gemma4_moe", tmp_path / "gemma4"
    assert family_problem(Family.gemma4, gemma_moe).endswith(
        "gives model_type 'gemma4_text' (Gemma4ForCausalLM): that checkpoint loads with model=gemma4_moe, "
        "not model=gemma4")
    assert "loads with model=gemma4, not model=gemma4_moe" in family_problem(Family.gemma4_moe, gemma)
    why = family_problem(Family.olmoe, tmp_path / "mistral")
    assert why == (f"{tmp_path / 'mistral' / 'config.json'} gives model_type 'mistral' (MistralForCausalLM): "
                   "that checkpoint loads with model=mistral, not model=olmoe")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_model_type_no_family_loads_is_refused_and_pointed_at_model_hf_which_loads_it(kind, tmp_path):
    d = tiny_hf_checkpoint(kind, tmp_path / kind, weights=False)
    why = family_problem(Family.mistral, d)
    assert why.startswith(f"{d / 'config.json'} gives model_type '{kind}' (") and why.endswith(
        "which is not one of align's families (mistral: model=mistral; olmoe: model=olmoe; gemma4_text: "
        "model=gemma4, model=gemma4_moe): model=hf loads any causal-LM checkpoint transformers knows"), why
    assert family_problem(Family.hf, d) is None


def test_a_relabelled_or_unlabelled_config_is_refused(tmp_path):
    d = tiny_hf_checkpoint("llama", tmp_path / "relabelled", weights=False)
    _edit_config(d, model_type="mistral")  # architectures still LlamaForCausalLM
    assert family_problem(Family.mistral, d) == (
        f"{d / 'config.json'} lists architectures LlamaForCausalLM; model=mistral builds MistralForCausalLM, "
        "which does not hold that model's tensors")
    # model=hf runs a mistral model_type as model=mistral: refused alike
    assert family_problem(Family.hf, d) == family_problem(Family.mistral, d)
    _edit_config(d, model_type=None)
    assert family_problem(Family.mistral, d) == (
        f"{d / 'config.json'} has no model_type; model=mistral loads model_type 'mistral' checkpoints")
    assert family_problem(Family.hf, d) == (
        f"{d / 'config.json'} has no model_type; model=hf builds the class transformers maps it to")


def test_model_hf_refuses_what_transformers_maps_to_no_causal_lm_or_another_head(tmp_path):
    d = tiny_hf_checkpoint("qwen2", tmp_path / "qwen2", weights=False)
    _edit_config(d, architectures=["Qwen2ForSequenceClassification"])
    assert family_problem(Family.hf, d) == (
        f"{d / 'config.json'} lists architectures Qwen2ForSequenceClassification; model=hf builds "
        "Qwen2ForCausalLM, which does not hold that model's tensors")
    _edit_config(d, model_type="vit", architectures=["ViTModel"])
    assert family_problem(Family.hf, d) == (
        f"{d / 'config.json'} gives model_type 'vit' (ViTModel), which transformers' AutoModelForCausalLM maps "
        "to no class: model=hf trains causal LMs only")


def test_preflight_and_the_build_refuse_another_familys_checkpoint_before_any_weight(build, tmp_path,
                                                                                     monkeypatch):
    from align.config import to_typed
    from align.run.cli import compose
    from align.run.preflight_checks import collect, run_preflight

    d = tiny_checkpoint(tmp_path / "mistral", Family.mistral)
    typed = to_typed(compose(["model=olmoe", f"model.pretrained={d}", "allow_dirty=true"]))
    with pytest.raises(ConfigError, match=r"^model.pretrained: .* loads with model=mistral, not model=olmoe$"):
        run_preflight(typed)
    checks = {c.name: c for c in collect(typed)}
    assert not checks["checkpoint family"].ok and checks["checkpoint dir"].ok
    # the build refuses it too, before transformers reads the file as an OLMoE config or any weight
    import transformers

    monkeypatch.setattr(transformers.OlmoeForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("weights read for a refused checkpoint"))
    with pytest.raises(ConfigError, match="loads with model=mistral, not model=olmoe"):
        build(Family.olmoe, pretrained=str(d))


# ------------------------------------------------------------------------------- the load


def _renamed(d: Path) -> None:
    _edit_tensors(d, lambda t: t.update({"model.layers.0.self_attn.qq_proj.weight":
                                         t.pop("model.layers.0.self_attn.q_proj.weight")}))


def _half(d: Path) -> None:
    _edit_tensors(d, lambda t: [t.pop(k) for k in sorted(t)[::2]])


BROKEN = {
    # a tensor renamed: one missing (would train from random init), one dropped
    "renamed": (_renamed, "1 of the model's 21 tensors missing from it (model.layers.0.self_attn.q_proj.weight): "
                "they would start from random init; 1 of its tensors with no place in the model "
                "(model.layers.0.self_attn.qq_proj.weight): they would be dropped"),
    "half missing": (_half, "11 of the model's 21 tensors missing from it (lm_head.weight, "),
    # Qwen2 relabelled as Mistral passes the model_type check: its q/k/v biases would be dropped
    "qwen2 as mistral": (None, "6 of its tensors with no place in the model (model.layers.0.self_attn.k_proj.bias, "
                         "model.layers.0.self_attn.q_proj.bias, model.layers.0.self_attn.v_proj.bias, ...)"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_checkpoint_whose_tensors_do_not_all_land_is_refused_in_one_line(case, build, tmp_path):
    break_, says = BROKEN[case]
    if break_ is None:
        d = tiny_hf_checkpoint("qwen2", tmp_path / "ckpt")
        _edit_config(d, model_type="mistral", architectures=["MistralForCausalLM"])
    else:
        d = tiny_checkpoint(tmp_path / "ckpt", Family.mistral)
        break_(d)
    with pytest.raises(ConfigError) as e:
        build(pretrained=str(d))
    line = str(e.value)
    assert line.startswith(f"model.pretrained: the checkpoint {d} does not fit MistralForCausalLM: ") and says in line
    assert "\n" not in line


def test_a_shape_mismatch_is_named_with_both_shapes(build, tmp_path):
    d = tiny_checkpoint(tmp_path / "ckpt", Family.mistral)
    _edit_tensors(d, lambda t: t.update({"model.norm.weight": torch.ones(7)}))
    with pytest.raises(ConfigError, match=r"1 of another shape \(model.norm.weight \[7\] vs the model's \[128\]\)"):
        build(pretrained=str(d))


def test_a_tied_lm_head_may_be_absent_and_the_record_says_so(build, tmp_path):
    d = tmp_path / "tied"
    build(Family.mistral, overrides={"tie_word_embeddings": True}).model.save_pretrained(d)
    assert "lm_head.weight" not in load_file(d / "model.safetensors")
    b = build(pretrained=str(d))
    params = len(dict(b.model.named_parameters()))  # each tensor once: the tied head is the embedding
    assert b.info["weights"] == {
        "loaded": params, "missing": 0, "unexpected": 0, "mismatched": 0,
        "allowed_missing": {"tied": {"lm_head.weight": "model.embed_tokens.weight"},
                            "non_persistent_buffers": ["model.rotary_emb.inv_freq",
                                                       "model.rotary_emb.original_inv_freq"]}}
    assert build().info["weights"] is None  # random init


class Payload:
    """Not a tensor: a pickle holding it runs code on load unless the loader is weights-only."""


def test_a_pickle_the_weights_only_loader_refuses_is_one_line_naming_the_file(build, tmp_path):
    from align.models.checkpoint_files import checkpoint_problem

    d = tiny_checkpoint(tmp_path / "ckpt", Family.mistral)
    tensors = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    torch.save(tensors, d / "pytorch_model.bin")
    assert checkpoint_problem(d) is None  # plain tensors: the weights-only loader takes them
    assert build(pretrained=str(d)).info["weights"]["missing"] == 0
    torch.save({**tensors, "payload": Payload()}, d / "pytorch_model.bin")
    says = (f"{d / 'pytorch_model.bin'} is refused by torch's weights-only loader: its pickle names "
            f"{__name__}.Payload, not plain tensors; align never unpickles objects: save the weights as "
            "safetensors (accepted)")
    assert checkpoint_problem(d) == says  # preflight, from the pickle's globals
    with pytest.raises(ConfigError) as e:  # the load, where preflight did not run
        build(pretrained=str(d))
    assert str(e.value) == f"model.pretrained: {says}"
