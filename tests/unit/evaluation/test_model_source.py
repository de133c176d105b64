"""Every model dir of an eval gets align.train's checkpoint file checks before the first arm, and a model
whose tensors do not all land is refused (one line naming the key), never scored half random."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from align.errors import ConfigError
from tests.unit.evaluation.conftest import run_config


def _copy(export: Path, d: Path) -> Path:
    shutil.copytree(export, d)
    return d


def _truncate(d: Path) -> None:
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])


def _corrupt_config(d: Path) -> None:
    (d / "config.json").write_text('{"model_type": "mistral",')


FILES = {
    "truncated": (_truncate, "{d}/model.safetensors is truncated"),
    "corrupt config.json": (_corrupt_config, "{d}/config.json is not valid JSON"),
}


@pytest.mark.parametrize("case", list(FILES))
@pytest.mark.parametrize("key", ["model_dir", "eval.compare_to"])
def test_each_model_dir_gets_the_checkpoint_file_checks_in_preflight(tiny_export, tmp_path, key, case):
    from align.evaluation.eval_checks import check

    bad = _copy(tiny_export, tmp_path / "bad")
    FILES[case][0](bad)
    cfg = run_config(bad if key == "model_dir" else tiny_export, tmp_path)
    if key == "eval.compare_to":
        cfg.eval = replace(cfg.eval, compare_to=str(bad))
    with pytest.raises(ConfigError) as e:
        check(cfg)
    assert str(e.value).startswith(f"{key}: {FILES[case][1].format(d=bad)}"), str(e.value)


def test_a_compare_to_whose_tensors_do_not_all_land_ends_the_eval_with_exit_2_on_record(tiny_export, tmp_path):
    from safetensors.torch import load_file, save_file

    from align.evaluation.job import EvalJob

    bad = _copy(tiny_export, tmp_path / "bad")
    tensors = load_file(bad / "model.safetensors")
    tensors["model.embed.weight"] = tensors.pop("model.embed_tokens.weight")
    save_file(tensors, bad / "model.safetensors", metadata={"format": "pt"})
    cfg = run_config(tiny_export, tmp_path)
    cfg.eval = replace(cfg.eval, compare_to=str(bad))
    with pytest.raises(ConfigError) as e:
        EvalJob(cfg, tmp_path / "run", [], [], {}).run()
    assert str(e.value).startswith(
        f"eval.compare_to: the checkpoint {bad} does not fit MistralForCausalLM: 1 of the model's 21 tensors missing "
        "from it (model.embed_tokens.weight): they would start from random init; 1 of its tensors with no place in "
        "the model (model.embed.weight)"), str(e.value)
    record = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert record["run"]["exit_code"] == 2 and "compare_to" not in record["arms"]
    weights = record["arms"]["model"]["model"]["weights"]  # the first arm's load, in full
    assert (weights["loaded"], weights["missing"], weights["unexpected"], weights["mismatched"]) == (21, 0, 0, 0)


# ------------------------------------------------------------------------ a training checkpoint


@pytest.fixture
def dcp_checkpoint(tmp_path):
    """<run>/checkpoints/step_00000001 as a training run leaves it (model/ in DCP, the run's .hydra/config.yaml)."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from omegaconf import OmegaConf
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from align.run.cli import compose
    from tests.conftest import build_tiny

    def make(edit=lambda tensors: None) -> Path:
        run = tmp_path / "train"
        step = run / "checkpoints" / "step_00000001"
        (run / ".hydra").mkdir(parents=True)
        OmegaConf.save(compose([]), run / ".hydra" / "config.yaml")
        model = build_tiny().model
        tensors = dict(get_model_state_dict(model))
        edit(tensors)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(tensors, checkpoint_id=step / "model", no_dist=True)
            dcp.save({"step": torch.zeros(1)}, checkpoint_id=step / "optim", no_dist=True)
        (step / "meta.json").write_text(json.dumps({"world_size": 1, "step": 1}))
        (step / "rank0.json").write_text("{}")
        return step

    return make


def test_a_training_checkpoint_with_a_tensor_the_model_lacks_is_refused(dcp_checkpoint):
    from align.evaluation.model_source import resolve_source

    step = dcp_checkpoint(lambda t: t.update({"model.extra.weight": torch.zeros(3)}))
    with pytest.raises(ConfigError, match=rf"^model_dir: the checkpoint {step / 'model'} does not fit "
                                          r"MistralForCausalLM: 1 of its tensors with no place in the model "
                                          r"\(model.extra.weight\): they would be dropped$"):
        resolve_source(str(step), "model_dir").load(torch.device("cpu"), torch.float32)


def test_a_training_checkpoint_that_cannot_be_read_is_one_line(dcp_checkpoint):
    from align.evaluation.model_source import resolve_source

    step = dcp_checkpoint()
    loaded = resolve_source(str(step), "model_dir").load(torch.device("cpu"), torch.float32)
    assert loaded[2]["missing"] == 0 and loaded[2]["loaded"] == 21
    for f in (step / "model").glob("*.distcp"):
        f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(ConfigError) as e:
        resolve_source(str(step), "model_dir").load(torch.device("cpu"), torch.float32)
    assert str(e.value) == f"model_dir: cannot load the checkpoint {step / 'model'}: EOFError: no message"


def test_a_training_checkpoint_whose_run_config_or_base_is_bad_is_refused_in_preflight(dcp_checkpoint, tmp_path):
    from align.evaluation.model_source import resolve_source

    step = dcp_checkpoint()
    run_config_file = step.parents[1] / ".hydra" / "config.yaml"
    text = run_config_file.read_text()
    run_config_file.write_text(text + "\n  : [unclosed\n")
    with pytest.raises(ConfigError, match=rf"^model_dir: {run_config_file} \(the model is rebuilt from it\) is not "
                                          "a readable run config: "):
        resolve_source(str(step), "model_dir")
    import transformers

    base = tmp_path / "llama"
    transformers.LlamaConfig(num_hidden_layers=1, architectures=["LlamaForCausalLM"]).save_pretrained(base)
    (base / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # empty, whole
    run_config_file.write_text(text.replace("pretrained: null", f"pretrained: {base}", 1))
    with pytest.raises(ConfigError, match=r"^model_dir: its run's model.pretrained \(the base the model is rebuilt "
                                          r"on\): .* model_type 'llama' \(LlamaForCausalLM\), which is not one of "
                                          "align's families"):
        resolve_source(str(step), "model_dir")
