"""The W&B seams without a W&B run: the run id a resume reuses, a sweep job's name, the summary's
flattening, and the init kwargs checked by name against the installed wandb."""

from __future__ import annotations

import inspect
import json

from align.config import LoggerConfig
from align.core.redaction import REDACTED
from align.telemetry.wandb_logger import (
    RUN_ID_FILE,
    artifact_kwargs,
    has_export,
    summary_scalars,
    sweep_job_name,
    wandb_init_kwargs,
    wandb_run_id,
    wandb_settings,
)


def test_a_resume_reuses_the_run_dirs_wandb_id_and_a_fresh_start_does_not(tmp_path):
    assert wandb_run_id(tmp_path, resuming=True) != wandb_run_id(tmp_path, resuming=True)  # nothing stored yet
    (tmp_path / RUN_ID_FILE).parent.mkdir(parents=True)
    (tmp_path / RUN_ID_FILE).write_text("abc12345\n")
    assert wandb_run_id(tmp_path, resuming=True) == "abc12345"
    assert wandb_run_id(tmp_path, resuming=False) != "abc12345"
    kw = wandb_init_kwargs(LoggerConfig(), tmp_path, "n", None, {}, resuming=True)
    assert kw["id"] == "abc12345" and kw["resume"] == "allow"


def test_init_and_artifact_kwargs_are_names_the_installed_wandb_accepts(tmp_path):
    import wandb
    from wandb.sdk.wandb_run import Run

    assert set(wandb_init_kwargs(LoggerConfig(), tmp_path, "n", None, {})) <= set(
        inspect.signature(wandb.init).parameters)
    art, log = artifact_kwargs("abc", 3, tmp_path)
    assert set(art) <= set(inspect.signature(wandb.Artifact).parameters)
    assert set(log) <= set(inspect.signature(Run.log_artifact).parameters)


def test_a_sweep_job_is_named_by_its_swept_values():
    task = ["optimizer.lr=3e-4", "trainer.max_steps=3", "sampler.bucket_size=32", "allow_dirty=true"]
    sweep = ["optimizer.lr=1e-4,3e-4", "trainer.max_steps=3", "sampler.bucket_size=range(2,64)", "allow_dirty=true"]
    assert sweep_job_name(task, sweep) == "optimizer.lr=3e-4,sampler.bucket_size=32"
    assert sweep_job_name(task, None) == ",".join(task)  # a sweeper plugin's params: every override of the job
    assert sweep_job_name(["+logger.api_key=sk-x", "optimizer.lr=1"], ["+logger.api_key=a,b"]) == \
        f"+logger.api_key={REDACTED}"
    assert sweep_job_name([], ["optimizer.lr=1,2"]) is None


def test_the_summary_holds_flat_chartable_values():
    out = summary_scalars({"steps": 4, "loss": {"kind": "ce", "chunk_tokens": 0}, "parallel": {"mesh": [2, 1]},
                           "resumed_from": None, "x": {"y": {"z": 1.5}}})
    assert out == {"steps": 4, "loss/kind": "ce", "loss/chunk_tokens": 0, "parallel/mesh": json.dumps([2, 1]),
                   "resumed_from": None, "x/y/z": 1.5}


def test_log_model_without_an_export_is_refused_at_config_time(compose):
    import pytest

    from align.config import to_typed
    from align.errors import ConfigError

    assert to_typed(compose(["logger.log_model=true"])).logger.log_model is True
    for bad in (["trainer.export=false"], ["logger=none"]):
        with pytest.raises(ConfigError, match="logger.log_model: needs logger=wandb and trainer.export=true"):
            to_typed(compose(["logger.log_model=true", *bad]))


def test_an_adapter_only_export_is_an_export_to_log(tmp_path):
    assert not has_export(tmp_path)
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")  # model.lora.export=adapter
    assert has_export(tmp_path)
    (tmp_path / "adapter" / "adapter_config.json").unlink()
    (tmp_path / "config.json").write_text("{}")
    assert has_export(tmp_path)


def test_a_redacted_sweep_record_still_names_the_job_by_its_swept_values(tmp_path):
    from omegaconf import OmegaConf

    from align.run.hydra_files import scrub_sweep_record

    token = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cD1eF3g"
    (tmp_path / "multirun.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create({
        "name": token, "hydra": {"overrides": {"task": [f"name={token}", "optimizer.lr=1e-4,3e-4"]},
                                 "job": {"override_dirname": f"name={token},optimizer.lr=1e-4"}}})))
    scrub_sweep_record(tmp_path)  # Hydra wrote it before any job ran
    text = (tmp_path / "multirun.yaml").read_text()
    assert token not in text and "name=<redacted>" in text
    sweep = list(OmegaConf.load(tmp_path / "multirun.yaml").hydra.overrides.task)
    assert sweep_job_name([f"name={token}", "optimizer.lr=0.0003"], sweep) == "optimizer.lr=0.0003"


ENV = {"WANDB_PROJECT": "p-env", "WANDB_ENTITY": "e-env", "WANDB_MODE": "online"}


def test_wandb_env_is_honoured_where_the_config_is_null_and_the_config_wins_where_set(compose):
    from align.config import to_typed

    def settings(*overrides, environ=ENV):
        s = wandb_settings(to_typed(compose(["logger=wandb", *overrides])).logger, environ)
        return {k: (v["value"], v["source"]) for k, v in s.items()}

    assert settings() == {"project": ("p-env", "$WANDB_PROJECT"), "entity": ("e-env", "$WANDB_ENTITY"),
                          "mode": ("online", "$WANDB_MODE")}
    assert settings("logger.project=mine", "logger.entity=me", "logger.mode=offline") == {
        "project": ("mine", "logger.project"), "entity": ("me", "logger.entity"), "mode": ("offline", "logger.mode")}
    assert settings(environ={}) == {"project": ("align", "default"), "entity": (None, "default"),
                                    "mode": ("offline", "default")}


def test_a_wandb_mode_align_does_not_take_is_one_line_unless_the_config_sets_mode(compose):
    import pytest

    from align.config import to_typed
    from align.errors import ConfigError

    cfg = to_typed(compose(["logger=wandb"])).logger
    with pytest.raises(ConfigError, match=r"^WANDB_MODE: accepted with logger=wandb: offline, online"):
        wandb_settings(cfg, {"WANDB_MODE": "disabled"})
    cfg = to_typed(compose(["logger=wandb", "logger.mode=offline"])).logger
    assert wandb_settings(cfg, {"WANDB_MODE": "disabled"})["mode"]["value"] == "offline"
