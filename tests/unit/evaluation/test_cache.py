"""The eval cache key holds every part that gives an arm's results their meaning: each changed part
misses, the same parts hit; entries are whole or absent; a finished arm re-run generates nothing."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest

from align.evaluation.config import EvalConfig
from align.evaluation.eval_cache import EvalCache, cache_key, key_parts
from align.evaluation.runner import generation_meaning
from align.generation import EngineConfig, GenerateMode
from tests.unit.evaluation.conftest import run_config

MODEL = {"weights_sha256": "a" * 64, "config_sha256": "b" * 64, "tokenizer_sha256": "c" * 64,
         "chat_template_sha256": "d" * 64, "path": "/somewhere/export", "kind": "export"}
DATA = {"sha256": "e" * 64, "limit": 8, "records": 8, "prompt_field": "question", "id_field": None,
        "reference_field": "answer"}
SCORER = {"name": "gsm8k", "version": 1}
EVAL = EvalConfig()
ENGINE = EngineConfig()


def parts(model=MODEL, cfg=EVAL, engine=ENGINE, device="cpu", dtype="float32", data=DATA,
          scorer=SCORER, template="{prompt}"):
    return key_parts(model=model, generation=generation_meaning(cfg, engine, device, dtype), data=data,
                     scorer=scorer, template=template)


def _with(d: dict, **kw) -> dict:
    return {**copy.deepcopy(d), **kw}


CHANGES = {
    "weights": dict(model=_with(MODEL, weights_sha256="f" * 64)),
    "model config": dict(model=_with(MODEL, config_sha256="f" * 64)),
    "tokenizer": dict(model=_with(MODEL, tokenizer_sha256="f" * 64)),
    "chat template": dict(model=_with(MODEL, chat_template_sha256="f" * 64)),
    "seed": dict(cfg=EvalConfig(samples=4, seed=1)),
    "samples": dict(cfg=EvalConfig(samples=2)),
    "temperature": dict(cfg=EvalConfig(temperature=0.7)),
    "top_p": dict(cfg=EvalConfig(temperature=1.0, top_p=0.9)),
    "top_k": dict(cfg=EvalConfig(temperature=1.0, top_k=5)),
    "max_new_tokens": dict(cfg=EvalConfig(max_new_tokens=64)),
    "engine batch size": dict(engine=EngineConfig(batch_size=8)),
    "engine padding multiple": dict(engine=EngineConfig(pad_to_multiple_of=16)),
    "engine mode": dict(engine=EngineConfig(mode=GenerateMode.static)),
    "device type": dict(device="cuda", engine=EngineConfig(mode=GenerateMode.dynamic)),
    "dtype": dict(dtype="bfloat16"),
    "data content": dict(data=_with(DATA, sha256="f" * 64)),
    "data limit": dict(data=_with(DATA, limit=16)),
    "data records": dict(data=_with(DATA, records=7)),
    "prompt field": dict(data=_with(DATA, prompt_field="q")),
    "reference field": dict(data=_with(DATA, reference_field="a")),
    "verifier": dict(scorer={"name": "math", "version": 1, "math_verify": "0.9.0"}),
    "verifier version": dict(scorer={"name": "gsm8k", "version": 2}),
    "template": dict(template="Solve: {prompt}"),
}


@pytest.mark.parametrize("change", list(CHANGES), ids=list(CHANGES))
def test_every_part_of_the_meaning_changes_the_key(change):
    assert cache_key(parts(**CHANGES[change])) != cache_key(parts())


def test_the_same_meaning_is_the_same_key_and_the_path_is_not_part_of_it():
    assert cache_key(parts()) == cache_key(parts())
    assert cache_key(parts(model=_with(MODEL, path="/moved/export"))) == cache_key(parts())


def test_a_run_hits_its_entry_and_nothing_else(tmp_path):
    cache = EvalCache(tmp_path)
    assert cache.get(parts()) is None
    path = cache.put(parts(), {"run": {"x": 1}})
    assert cache.get(parts()) == {"run": {"x": 1}}
    assert cache.get(parts(template="Q: {prompt}")) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # the temporary file was renamed


def test_an_entry_that_does_not_hold_its_parts_is_a_miss(tmp_path):
    cache = EvalCache(tmp_path)
    path = cache.put(parts(), {"run": {"x": 1}})
    entry = json.loads(path.read_text())
    entry["parts"]["data"]["limit"] = 99
    path.write_text(json.dumps(entry))
    assert cache.get(parts()) is None
    path.write_text("{ torn")
    assert cache.get(parts()) is None


def test_a_finished_arm_rerun_generates_nothing_and_a_changed_one_does(tiny_export, tmp_path, monkeypatch):
    from align.evaluation.job import EvalJob
    from align.evaluation.model_source import ModelSource

    def job(cfg, name):
        return EvalJob(cfg, tmp_path / name, [], [], {"eval": name})

    loads = []
    real_load = ModelSource.load
    monkeypatch.setattr(ModelSource, "load", lambda self, *a: loads.append(self.path) or real_load(self, *a))
    cfg = run_config(tiny_export, tmp_path)
    assert job(cfg, "first").run() == 0 and len(loads) == 1
    assert job(cfg, "again").run() == 0 and len(loads) == 1
    first, again = (json.loads((tmp_path / n / "eval.json").read_text()) for n in ("first", "again"))
    assert (first["arms"]["model"]["cache"]["hit"], again["arms"]["model"]["cache"]["hit"]) == (False, True)
    assert first["arms"]["model"]["metrics"] == again["arms"]["model"]["metrics"]
    samples = [(tmp_path / n / "samples-model.jsonl").read_text() for n in ("first", "again")]
    assert samples[0] == samples[1]
    changed = replace(cfg, eval=replace(cfg.eval, max_new_tokens=cfg.eval.max_new_tokens + 1))
    assert job(changed, "changed").run() == 0 and len(loads) == 2
    off = replace(cfg, eval=replace(cfg.eval, cache=False))
    assert job(off, "off").run() == 0 and len(loads) == 3
    rec = json.loads((tmp_path / "off" / "eval.json").read_text())["arms"]["model"]["cache"]
    assert rec["enabled"] is False and rec["hit"] is False and rec["dir_source"] is None
    assert first["arms"]["model"]["cache"]["dir_source"] == "eval.cache_dir"


def test_by_default_the_eval_cache_is_in_the_user_cache_directory(tiny_export, tmp_path, monkeypatch):
    from align.evaluation.job import EvalJob

    monkeypatch.setenv("ALIGN_CACHE_DIR", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert EvalJob(run_config(tiny_export, tmp_path, cache_dir=None), tmp_path / "run", [], [], {}).run() == 0
    rec = json.loads((tmp_path / "run" / "eval.json").read_text())["arms"]["model"]["cache"]
    assert rec["dir_source"] == "$ALIGN_CACHE_DIR/eval" and Path(rec["path"]).parent == tmp_path / "home" / "eval"
    assert Path(rec["path"]).is_file() and not (tmp_path / ".cache").exists()


def test_an_engine_that_resolved_other_settings_than_the_key_says_stops_the_arm(tiny_export, tmp_path, monkeypatch):
    from align.evaluation.job import EvalJob
    from align.generation.align_engine import AlignEngine

    real = AlignEngine.describe
    monkeypatch.setattr(AlignEngine, "describe", lambda self: {**real(self), "batch_size": self.cfg.batch_size + 1})
    with pytest.raises(RuntimeError, match="the eval cache key says"):
        EvalJob(run_config(tiny_export, tmp_path), tmp_path / "run", [], [], {}).run()
    assert not list((tmp_path / "cache").glob("*.json"))  # nothing filed under the wrong settings
