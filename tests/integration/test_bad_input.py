"""Bad input exits 2 with ONE line naming the key or path and what is accepted, before any
tokenizer or model load, and writes nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# Runs align.train in a child that reports, at exit, whether transformers was ever imported.
PROBE = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: sys.stdout.write('TRANSFORMERS_IMPORTED=%s\\n' % ('transformers' in sys.modules)))\n"
    "sys.argv = ['align.train'] + sys.argv[1:]\n"
    "runpy.run_module('align.train', run_name='__main__')\n"
)


# Prepended to PROBE: the child's import system finds none of the packages named in HIDDEN (every finder
# on sys.meta_path wrapped), so they are missing there as if not installed, whatever this machine has.
HIDE = (
    "import sys\n"
    "class _Hidden:\n"
    "    def __init__(self, finder):\n"
    "        self.finder = finder\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.partition('.')[0] in HIDDEN:\n"
    "            return None\n"
    "        return self.finder.find_spec(name, path, target)\n"
    "    def __getattr__(self, attr):\n"
    "        return getattr(self.finder, attr)\n"
    "sys.meta_path[:] = [_Hidden(f) for f in sys.meta_path]\n"
)


def _run(tmp_path: Path, *args: str, hidden: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """align.train in a child (PROBE), the packages `hidden` missing there."""
    run_dir = tmp_path / "run"
    code = f"HIDDEN = {set(hidden)!r}\n{HIDE}{PROBE}" if hidden else PROBE
    return subprocess.run([sys.executable, "-c", code, f"hydra.run.dir={run_dir}", "logger=none", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


CASES = [
    (["model=llama"], "model=llama", "accepted: gemma4, gemma4_moe, hf, mistral, olmoe"),
    (["model=hf"], "model.pretrained", "model=hf needs a checkpoint dir: set model.pretrained=<local HF checkpoint"),
    (["trainer.max_steps=ten"], "trainer.max_steps", "Integer"),
    (["sampler.kind=sorted"], "sampler.kind", "shuffle"),
    (["trainer.max_step=10"], "trainer.max_step", "accepted keys:"),
    (["trainer.max_steps=0"], "trainer.max_steps", ">= 1"),
    (["data=jsonl", "data.path=/nonexistent/train.jsonl"], "data.path", "/nonexistent/train.jsonl"),
    (["model.pretrained=/nonexistent/ckpt"], "model.pretrained", "/nonexistent/ckpt"),
    # non-finite floats: `inf > 0` passed, and a NaN clip norm turned clipping off
    (["optimizer.lr=inf"], "optimizer.lr", "must be a finite number (got inf)"),
    (["optimizer.max_grad_norm=nan"], "optimizer.max_grad_norm", "must be a finite number (got nan)"),
    # a key the composed option does not read (this one trained on the bundled GSM8K)
    (["data.path=/my/file.jsonl"], "data.path",
     "ignored by data=gsm8k; it is read by data=jsonl, data=parquet, data=tokens"),
    # a key the schema does not declare, added with +
    (["+trainer.max_stepz=5"], "trainer.max_stepz", "did you mean trainer.max_steps?"),
    # a key another objective reads: the composed objective's own schema does not declare it
    (["objective=sft", "objective.simpo_gamma=0.1"], "objective.simpo_gamma",
     "unknown key in objective=sft (a key of objective=dpo); accepted keys: kind"),
    # values torch refuses only when the optimizer is built
    (["optimizer.betas=[0.9,1.5]"], "optimizer.betas", "each beta must be in [0, 1)"),
    # the nested schema's keys, the closest name, and Hydra's own hints
    (["model.lora.enable=true"], "model.lora.enable", "unknown key in model.lora (did you mean model.lora.enabled?)"),
    (["optimizer.lr=1e-4,3e-4"], "optimizer.lr=1e-4,3e-4", "add --multirun to your command line"),
    # a directory is not "no such file"; a path Hydra's grammar cannot read bare gets the quoted form
    (["data=jsonl", "data.path=/"], "data.path", "/ is a directory; accepted: a JSONL file"),
    (["data=jsonl", "data.path=/tmp/my data (1)/x.jsonl"], "data.path=/tmp/my data (1)/x.jsonl",
     """quote it: 'data.path="/tmp/my data (1)/x.jsonl"'"""),
    # a GRPO composition whose every advantage is 0 (it ran to exit 0 with a loss and gradient of 0)
    (["objective=grpo", "objective.group_size=1", "objective.advantage=dr_grpo"], "objective.group_size",
     "advantage=dr_grpo needs >= 2 completions per prompt"),
    # a python reward is imported and its signature checked in preflight, before the tokenizer
    (["objective=grpo", "reward=python", "reward.function=tests.python_rewards:missing"], "reward.function",
     "tests.python_rewards has no attribute 'missing'"),
    # a tool of a multi-turn GRPO run is imported in preflight too
    (["objective=grpo", "objective.max_turns=2", "objective.tools=[align.rewards.nope:calc]"], "objective.tools[0]",
     "cannot import align.rewards.nope"),
    # a reward model is read from its files in preflight (the other refusals: tests/unit/rewards/test_model_reward.py)
    (["objective=grpo", "reward=model", "reward.path=/nonexistent/rm/export"], "reward.path",
     "no such directory: /nonexistent/rm/export (accepted: the export dir of an objective=reward_model run"),
]


@pytest.mark.parametrize("args,key,accepted", CASES, ids=[c[1] + ":" + c[0][-1] for c in CASES])
def test_bad_input_is_one_line_exit_2_before_heavy_work(tmp_path, args, key, accepted):
    p = _run(tmp_path, *args)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("align: error: ") and key in err[0] and accepted in err[0], err[0]
    assert "TRANSFORMERS_IMPORTED=False" in p.stdout, p.stdout
    assert not (tmp_path / "run").exists(), "a refused run must not leave a run dir behind"


@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow"])
def test_a_tracker_whose_package_is_missing_is_one_line_naming_its_extra(tmp_path, tracker):
    p = _run(tmp_path, f"logger={tracker}", hidden=(tracker,))
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert err == [f"align: error: logger: logger={tracker} needs the {tracker} package, which is not installed: "
                   f"pip install align[{tracker}]"], err
    assert "TRANSFORMERS_IMPORTED=False" in p.stdout and not (tmp_path / "run").exists()


def test_unreadable_checkpoint_dir_without_config(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"not really")
    p = _run(tmp_path, f"model.pretrained={ckpt}")
    assert p.returncode == 2 and "model.pretrained" in p.stderr and "config.json" in p.stderr, p.stderr[-2000:]


def test_a_bad_point_in_a_sweep_refuses_the_whole_sweep_before_any_job(tmp_path):
    sweep = tmp_path / "sweep"
    p = subprocess.run([sys.executable, "-m", "align.train", "-m", "trainer.max_steps=2,oops", "logger=none",
                        f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "trainer.max_steps" in p.stderr, p.stderr[-2000:]
    assert not sweep.exists()


def _checkpoint_dir(tmp_path: Path) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    from align.config import ModelConfig
    from align.data.tokenizer import tokenizer_dir

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tokenizer_dir(ModelConfig()), ckpt)  # a real tokenizer: only the weights are wrong
    (ckpt / "config.json").write_text('{"model_type": "mistral", "hidden_size": 8}')
    save_file({"w": np.zeros((64, 64), dtype=np.float32)}, str(ckpt / "model.safetensors"))
    return ckpt


def _one_line_exit_2(tmp_path: Path, p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("align: error: "), err
    assert "TRANSFORMERS_IMPORTED=False" in p.stdout, p.stdout
    assert not (tmp_path / "run").exists(), "a refused run must not leave a run dir behind"
    return err[0]


def test_a_corrupt_config_json_is_one_line_before_any_load(tmp_path):
    ckpt = _checkpoint_dir(tmp_path)
    (ckpt / "config.json").write_text('{"model_type": "mistral",\n "hidden_size": 8,')
    line = _one_line_exit_2(tmp_path, _run(tmp_path, f"model.pretrained={ckpt}"))
    assert "model.pretrained" in line and f"{ckpt / 'config.json'} is not valid JSON" in line, line


def test_a_truncated_safetensors_file_is_one_line_before_any_load(tmp_path):
    ckpt = _checkpoint_dir(tmp_path)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    cache = tmp_path / "cache"
    line = _one_line_exit_2(tmp_path, _run(tmp_path, f"model.pretrained={ckpt}", f"data.cache_dir={cache}"))
    assert "model.pretrained" in line and f"{weights} is truncated" in line, line
    assert not cache.exists()


def test_a_checkpoint_that_fails_only_at_load_is_one_error_and_leaves_no_cache_entry(tmp_path):
    """Whole files whose shapes disagree with their config.json pass every file check; the load
    itself refuses them: a ConfigError naming model.pretrained (exit 2 at the entry), and the
    encode made before the load is not cached (the cache is written once the build succeeds)."""
    import json

    from align.errors import ConfigError
    from tests.conftest import build_trainer, tiny_checkpoint

    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=rf"^model.pretrained: the checkpoint {ckpt} does not fit MistralForCausalLM: "
                                          r"6 of another shape \(model.layers.0.mlp.down_proj.weight \[128, 384\] vs "
                                          r"the model's \[128, 768\]"):
        build_trainer(tmp_path, f"model.pretrained={ckpt}", f"data.cache_dir={cache}", "trainer.max_steps=1")
    assert not cache.exists() or not any(cache.iterdir()), list(cache.iterdir())


def test_a_token_id_outside_the_vocabulary_names_its_line_before_the_run_dir(tmp_path):
    """Held against the model's tables in preflight (the meta model: no tokenizer, encode or weights),
    so the refusal names the row and leaves no run dir; it used to come after the build, without one."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 99999, 5]}\n')
    p = _run(tmp_path, "data=tokens", f"data.path={rows}", "allow_dirty=true")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    [line] = [ln for ln in p.stderr.splitlines() if ln.startswith("align: error: ")]
    assert line.startswith(f"align: error: {rows}:2: token id 99999 is out of the model's vocabulary (size 4096"), line
    assert "accepted: ids below 4096" in line and "Traceback" not in p.stderr
    assert not (tmp_path / "run").exists(), "a refused run must not leave a run dir behind"


def test_a_checkpoint_whose_tensors_do_not_all_land_is_one_line_exit_2_before_training(tmp_path):
    """Whole files of the right family whose tensor names do not match the model: transformers loads
    them, initialises what is missing at random and logs a report; align reads that report and
    refuses before step 1 (the in-process cases: tests/unit/models/test_checkpoint_fit.py)."""
    import json

    from safetensors.torch import load_file, save_file

    from tests.conftest import tiny_checkpoint

    ckpt = tiny_checkpoint(tmp_path / "ckpt")
    tensors = load_file(ckpt / "model.safetensors")
    tensors["model.layers.1.mlp.up.weight"] = tensors.pop("model.layers.1.mlp.up_proj.weight")
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    p = _run(tmp_path, f"model.pretrained={ckpt}", "allow_dirty=true", "data.max_records=32", "trainer.max_steps=2")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("align: error:")]
    assert errors == [f"align: error: model.pretrained: the checkpoint {ckpt} does not fit MistralForCausalLM: 1 of "
                      "the model's 21 tensors missing from it (model.layers.1.mlp.up_proj.weight): they would start "
                      "from random init; 1 of its tensors with no place in the model (model.layers.1.mlp.up.weight): "
                      "they would be dropped; accepted: a checkpoint holding exactly the model's tensors (tied ones "
                      "and non-persistent buffers aside)"], p.stderr[-3000:]
    assert "LOAD REPORT" not in p.stderr  # transformers' table is align's one line now
    manifest = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert manifest["run"]["exit_code"] == 2 and not (tmp_path / "run" / "history.jsonl").exists()


def test_records_that_mix_formats_are_one_line_before_the_run_dir(tmp_path):
    """Detected in preflight as the run detects it (align/data/formats.py), before torch is imported."""
    f = tmp_path / "mixed.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n'
                 '{"instruction": "Add 2 and 3.", "output": "5"}\n')
    p = _run(tmp_path, "data=jsonl", f"data.path={f}", "allow_dirty=true")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert err == [f"align: error: data.format: the records of {f} mix formats: messages ({f}:1), alpaca ({f}:2); "
                   "accepted: one format per source (one file per format, as a mixture), or data.format=<one of them>, "
                   "under which records of the others are bad records"], err
    assert "TRANSFORMERS_IMPORTED=False" in p.stdout and not (tmp_path / "run").exists()


def test_a_lora_target_module_the_model_lacks_is_one_line_naming_those_it_has_before_the_run_dir(tmp_path):
    """Held against the meta model in preflight (align/run/kwargs_sites.py builds peft's kwargs from it),
    so no weight is built and no run dir is made."""
    p = _run(tmp_path, "model.lora.enabled=true", "model.lora.target_modules=[q_proj,qkv_proj]", "allow_dirty=true")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("align: error: ")]  # torch's import warnings aside
    assert "Traceback" not in p.stderr
    assert err == ["align: error: model.lora.target_modules: no attention or dense-MLP nn.Linear of "
                   "MistralForCausalLM is named ['qkv_proj']; accepted: down_proj, gate_proj, k_proj, o_proj, q_proj, "
                   "up_proj, v_proj"], err
    assert not (tmp_path / "run").exists(), "a refused run must not leave a run dir behind"


def test_a_run_dir_that_cannot_be_created_is_one_line_exit_2_not_hydras_traceback(tmp_path):
    (tmp_path / "a_file").write_text("")
    p = subprocess.run([sys.executable, "-c", PROBE, f"hydra.run.dir={tmp_path / 'a_file' / 'run'}", "logger=none",
                        "allow_dirty=true"], cwd=REPO, capture_output=True, text=True, timeout=120)
    line = _one_line_exit_2(tmp_path, p)
    assert line == (f"align: error: hydra.run.dir: cannot create {tmp_path / 'a_file' / 'run'}: {tmp_path / 'a_file'} "
                    "is a file, not a directory; choose a dir this process can create"), line


def test_an_unpaired_record_whose_label_is_not_a_boolean_is_one_line_naming_its_line_before_the_run_dir(tmp_path):
    """objective=kto parses every record in preflight as the run does (align/data/unpaired.py), before torch."""
    f = tmp_path / "kto.jsonl"
    f.write_text('{"prompt": "2+2?", "completion": "4", "label": true}\n{"prompt": "2+3?", "completion": "6", '
                 '"label": "no"}\n')
    p = _run(tmp_path, "objective=kto", "data=preference", f"data.path={f}", "allow_dirty=true")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert err == [f"align: error: {f}:2: 'label' must be a JSON boolean, true (desirable) or false (undesirable) "
                   "(got 'no') (set data.on_bad_record=skip to skip such records)"], err
    assert "TRANSFORMERS_IMPORTED=False" in p.stdout and not (tmp_path / "run").exists()


def test_pairs_with_margins_under_an_objective_that_reads_none_are_one_line_naming_the_line_before_the_run_dir(
        tmp_path):
    """objective=dpo would train as if a pair's `margin` were not there (align/data/margins.py): refused in preflight,
    before torch (the in-process cases, a non-finite margin among them: tests/unit/data/test_margins.py)."""
    f = tmp_path / "pairs.jsonl"
    f.write_text('{"prompt": "2+2?", "chosen": "4", "rejected": "5", "margin": 1.5}\n'
                 '{"prompt": "2+3?", "chosen": "5", "rejected": "6", "margin": 0.5}\n')
    p = _run(tmp_path, "objective=dpo", "data=preference", f"data.path={f}", "allow_dirty=true")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert err == [f"align: error: {f}:1: the pair has a 'margin' (TRL's RewardTrainer margin), which objective=dpo "
                   "does not read: it would train as if the margins were not there; accepted: pairs without 'margin', "
                   "or an objective that reads it (objective=reward_model)"], err
    assert "TRANSFORMERS_IMPORTED=False" in p.stdout and not (tmp_path / "run").exists()


def test_a_teacher_of_another_tokenizer_is_one_line_exit_2_before_the_run_dir(tmp_path):
    """objective=distill compares two distributions id by id: preflight holds the teacher's tokenizer to the
    student's (the in-process cases: tests/unit/objectives/test_distill.py)."""
    from align.config import ModelConfig
    from align.data.tokenizer import load_tokenizer
    from tests.unit.objectives.conftest import teacher_checkpoint

    d = teacher_checkpoint(tmp_path / "teacher")
    tok = load_tokenizer(ModelConfig())
    tok.add_tokens(["<extra_tok>"])
    tok.save_pretrained(d)
    p = _run(tmp_path, "objective=distill", f"objective.teacher={d}", "allow_dirty=true")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = [ln for ln in p.stderr.splitlines() if ln.strip() and "Writing model shards" not in ln]
    assert len(err) == 1 and err[0].startswith("align: error: objective.teacher: the teacher's tokenizer"), err
    assert "accepted: a teacher" in err[0] and not (tmp_path / "run").exists()


def test_a_reward_model_without_a_trainable_scalar_head_is_one_line_before_the_run_dir(tmp_path):
    """objective=reward_model needs the family's AutoModelForSequenceClassification class, its head trained:
    refused in preflight, naming the family (align/models/scalar_head.py). LoRA's refusal, the same check:
    test_a_reward_model_under_lora_is_refused_in_preflight."""
    p = _run(tmp_path, "objective=reward_model", "allow_dirty=true", "model=olmoe")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    [line] = [ln for ln in p.stderr.splitlines() if ln.startswith("align: error: ")]
    assert line.startswith("align: error: model: objective=reward_model ") and \
        "maps model=olmoe (model_type 'olmoe') to none; accepted: model=mistral" in line, line
    assert "Traceback" not in p.stderr and not (tmp_path / "run").exists()


def test_a_reward_model_under_lora_is_refused_in_preflight(compose):
    """In process: the new score head is no adapter target, so LoRA would leave it at its random init."""
    from align.config import to_typed
    from align.errors import ConfigError
    from align.run.preflight_checks import run_preflight

    cfg = to_typed(compose(["objective=reward_model", "allow_dirty=true", "logger=none", "model.lora.enabled=true"]))
    with pytest.raises(ConfigError) as e:
        run_preflight(cfg)
    assert e.value.key == "model.lora.enabled" and "accepted: model.lora.enabled=false" in str(e.value)
    assert "\n" not in str(e.value)
