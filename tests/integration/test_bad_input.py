"""Bad input exits 2 with ONE line naming the key or path and what is accepted, before any
tokenizer or model load, and writes nothing."""

from __future__ import annotations

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
