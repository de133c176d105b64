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


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    run_dir = tmp_path / "run"
    return subprocess.run([sys.executable, "-c", PROBE, f"hydra.run.dir={run_dir}", "logger=none", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


CASES = [
    (["model=llama"], "model=llama", "accepted: gemma4, gemma4_moe, mistral, olmoe"),
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
    # values torch refuses only when the optimizer is built
    (["optimizer.betas=[0.9,1.5]"], "optimizer.betas", "each beta must be in [0, 1)"),
    # the nested schema's keys, the closest name, and Hydra's own hints
    (["model.lora.enable=true"], "model.lora.enable", "unknown key in model.lora (did you mean model.lora.enabled?)"),
    (["optimizer.lr=1e-4,3e-4"], "optimizer.lr=1e-4,3e-4", "add --multirun to your command line"),
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

    import torch

    from align.config import AttentionConfig, ModelConfig
    from align.data.tokenizer import load_tokenizer
    from align.errors import ConfigError
    from align.models import build_model
    from tests.conftest import build_trainer

    tok = load_tokenizer(ModelConfig())
    ckpt = tmp_path / "ckpt"
    build_model(ModelConfig(), AttentionConfig(), tok, torch.device("cpu")).model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=rf"^model.pretrained: cannot load the weights from {ckpt}: RuntimeError"):
        build_trainer(tmp_path, f"model.pretrained={ckpt}", f"data.cache_dir={cache}", "trainer.max_steps=1")
    assert not cache.exists() or not any(cache.iterdir()), list(cache.iterdir())


def test_a_run_dir_that_cannot_be_created_is_one_line_exit_2_not_hydras_traceback(tmp_path):
    (tmp_path / "a_file").write_text("")
    p = subprocess.run([sys.executable, "-c", PROBE, f"hydra.run.dir={tmp_path / 'a_file' / 'run'}", "logger=none",
                        "allow_dirty=true"], cwd=REPO, capture_output=True, text=True, timeout=120)
    line = _one_line_exit_2(tmp_path, p)
    assert line == (f"align: error: hydra.run.dir: cannot create {tmp_path / 'a_file' / 'run'}: {tmp_path / 'a_file'} "
                    "is a file, not a directory; choose a dir this process can create"), line
