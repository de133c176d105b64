"""Bit-exact resume on 2 gloo ranks (parallel=fsdp, attention dropout on, each rank drawing its own
masks): 20 micro-steps uninterrupted vs stopped after micro-step 10 and resumed. Final parameters
bit-identical, losses identical at every step.

The negative controls live here too, so the comparison is shown to see the difference it exists for:
resuming with the two ranks' optimizer shards swapped, without restoring the sampler position, or
with rank 0's RNG states restored on both ranks, must make the same comparison fail. (Swapping the two
ranks' DCP files on disk does not even load: DCP reads each item at its recorded offset and the files'
layouts differ, so it fails loudly.)
A newest checkpoint that one rank cannot read makes BOTH ranks fall back to the one before it, and
that resume is bit-exact too. All runs share one spawn of 2 processes.

Then, through the CLI (one process): the same command resumes a stopped run to its end and is then
refused on the finished run dir, which no command writes again (every file byte for byte); a resume
refused for other data leaves the run it would have continued byte for byte as it was, its own log and
exit record included; a corrupt newest checkpoint falls back to the newest that loads (and says so),
none loading is refused in one line; a restart after a kill before any checkpoint keeps one history
row per step.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO, run_cli
from tests.integration.distributed import TINY, fit_many, history, result, run

ACCUM, STEPS, STOP = 2, 10, 5  # 20 micro-steps; the stop lands after micro-step 10
VARIANTS = {"ep": ["model=olmoe", "parallel=ep"], "adamw8bit": ["parallel=fsdp", "optimizer=adamw8bit"]}
CFG = TINY + ["parallel=fsdp", f"trainer.grad_accum={ACCUM}", f"trainer.max_steps={STEPS}", "trainer.export=true",
              "+model.overrides.attention_dropout=0.2"]


# ----------------------------------------------------------- hooks (module level: spawn pickles them)


def own_rng(trainer, rank: int, then: Callable | None = None) -> None:
    """A fresh run's ranks each on their own torch RNG stream, so their dropout masks differ from the
    first step (the trainer seeds every rank alike: masks then differ only where batch shapes do) and a
    resume that gave a rank another rank's RNG state would train on other masks."""
    assert trainer.state.step == 0, "only a fresh run: a resume must keep the RNG states it restored"
    torch.manual_seed(1000 + rank)
    if then is not None:
        then(trainer, rank)


def request_stop_before(trainer, rank: int, step: int, on_rank: int) -> None:
    """Ask ONE rank to stop while it computes `step`, as its signal handler would."""
    if rank != on_rank:
        return
    inner = trainer.train_step

    def train_step(batches):
        if trainer.state.step == step - 1:
            trainer.stop.request(f"test: stop during step {step} on rank {on_rank}")
        return inner(batches)

    trainer.train_step = train_step


def forget_sampler_position(trainer, rank: int) -> None:
    """A resume that restores everything but the data position (the bug docs/pitfalls.md#15 describes)."""
    from align.data.loader import Position

    assert trainer.state.step == STOP, "the control must start from the resumed checkpoint"
    trainer.stream.position = Position()


def rank0_rng_on_every_rank(trainer, rank: int) -> None:
    """After the resume: every rank takes rank 0's RNG states from the checkpoint, as a loader that read
    rank0.json on every rank would."""
    from align.control.checkpoint import set_rng_state

    assert trainer.state.step == STOP, "the control must start from the resumed checkpoint"
    ckpt = trainer.run_dir / "checkpoints" / f"step_{STOP:08d}"
    set_rng_state(json.loads((ckpt / "rank0.json").read_text())["rng"], trainer.env.device)


def swap_optimizer_shards(trainer, rank: int) -> None:
    """After the resume: each rank takes the OTHER rank's shard of every optimizer state tensor."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    assert trainer.state.step == STOP, "the control must start from the resumed checkpoint"
    swapped = 0
    for state in trainer.optimizer.state.values():
        for v in state.values():
            if isinstance(v, DTensor):
                mine = v.to_local()
                both = [torch.empty_like(mine) for _ in range(2)]
                dist.all_gather(both, mine.contiguous())
                mine.copy_(both[1 - rank])
                swapped += 1
    assert swapped > 0


def copy_stop_checkpoint(rank: int, world: int, src: str, dsts: tuple[str, ...], fallback: str) -> None:
    """The stop checkpoint into each of `dsts`; every checkpoint into `fallback`, with rank 1's file of
    the newest one garbled (only rank 1 fails to read it)."""
    import torch.distributed as dist

    if rank == 0:
        ckpt = Path(src) / "checkpoints" / f"step_{STOP:08d}"
        for dst in dsts:
            shutil.copytree(ckpt, Path(dst) / "checkpoints" / ckpt.name)
        shutil.copytree(Path(src) / "checkpoints", Path(fallback) / "checkpoints")
        (Path(fallback) / "checkpoints" / ckpt.name / "rank1.json").write_text('{"rank": 1, "stream": ')
    dist.barrier()


# ------------------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    d = {k: str(root / k) for k in ("full", "stopped", "swapped", "nosampler", "fallback", "rank0rng")}
    keep = ["trainer.save_every=2", "trainer.keep_last=2"]
    jobs = [
        {"run_dir": d["full"], "overrides": CFG, "hook": own_rng},
        {"run_dir": d["stopped"], "overrides": CFG + keep,
         "hook": functools.partial(own_rng, then=functools.partial(request_stop_before, step=STOP, on_rank=1)),
         "after": functools.partial(copy_stop_checkpoint, src=d["stopped"],
                                    dsts=(d["swapped"], d["nosampler"], d["rank0rng"]), fallback=d["fallback"])},
        {"run_dir": d["stopped"], "overrides": CFG + keep},  # the resume: same command, same run dir
        {"run_dir": d["swapped"], "overrides": CFG, "hook": swap_optimizer_shards},
        {"run_dir": d["nosampler"], "overrides": CFG, "hook": forget_sampler_position},
        {"run_dir": d["fallback"], "overrides": CFG},
        {"run_dir": d["rank0rng"], "overrides": CFG, "hook": rank0_rng_on_every_rank},
    ]
    # The same stop + resume for the other layouts a checkpoint must survive: expert parallel (experts
    # on their own mesh) and torchao's 8-bit AdamW under FSDP (docs/pitfalls.md#12); 6 steps, stop after 3.
    for name, extra in VARIANTS.items():
        cfg = TINY + ["trainer.grad_accum=1", "trainer.max_steps=6", "trainer.export=true", *extra]
        d[f"{name}_full"], d[f"{name}_stopped"] = str(root / f"{name}_full"), str(root / f"{name}_stopped")
        jobs += [{"run_dir": d[f"{name}_full"], "overrides": cfg},
                 {"run_dir": d[f"{name}_stopped"], "overrides": cfg,
                  "hook": functools.partial(request_stop_before, step=3, on_rank=0)},
                 {"run_dir": d[f"{name}_stopped"], "overrides": cfg}]
    codes = run(fit_many, 2, jobs, str(root / "codes.json"), timeout=600)
    assert codes == [0, 0]
    return {k: Path(v) for k, v in d.items()}, json.loads((root / "codes.json").read_text())


def differences(ref: Path, other: Path) -> list[str]:
    """Every way `other` departs from `ref`: a loss at a step both logged, or a final parameter."""
    out = []
    mine = {r["step"]: r["loss"] for r in history(other)}
    for r in history(ref):
        if r["step"] in mine and mine[r["step"]] != r["loss"]:
            out.append(f"loss at step {r['step']}: {r['loss']!r} vs {mine[r['step']]!r}")
    a, b = load_file(ref / "export" / "model.safetensors"), load_file(other / "export" / "model.safetensors")
    assert a.keys() == b.keys()
    out += [f"param {k}" for k in a if not torch.equal(a[k], b[k])]
    return out


# ------------------------------------------------------------------------------------ tests


def test_stop_then_resume_is_bit_identical_to_the_uninterrupted_run(runs):
    dirs, codes = runs
    assert codes[:3] == [0, 143, 0]
    rows = history(dirs["stopped"])
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # one row per step across both attempts
    assert len(history(dirs["full"])) == STEPS
    assert differences(dirs["full"], dirs["stopped"]) == []
    assert result(dirs["stopped"], 0)["model_info"]["resumed_from"]["step"] == STOP
    assert result(dirs["stopped"], 1)["model_info"]["resumed_from"]["step"] == STOP


def test_negative_control_swapped_optimizer_shards_is_detected(runs):
    dirs, codes = runs
    assert codes[3] == 0
    diff = differences(dirs["full"], dirs["swapped"])
    assert any(d.startswith("param") for d in diff), diff


def test_negative_control_resume_without_sampler_state_is_detected(runs):
    dirs, codes = runs
    assert codes[4] == 0
    diff = differences(dirs["full"], dirs["nosampler"])
    assert any(d.startswith("loss") for d in diff) and any(d.startswith("param") for d in diff), diff


def test_negative_control_rank_0s_rng_on_every_rank_is_detected(runs):
    dirs, codes = runs
    assert codes[6] == 0
    ckpt = dirs["rank0rng"] / "checkpoints" / f"step_{STOP:08d}"
    states = [json.loads((ckpt / f"rank{r}.json").read_text())["rng"]["torch_cpu"] for r in (0, 1)]
    assert states[0] != states[1]  # each rank saved its own state: rank 1 restoring rank 0's changes its masks
    diff = differences(dirs["full"], dirs["rank0rng"])
    assert any(d.startswith("loss") for d in diff) and any(d.startswith("param") for d in diff), diff


def test_a_newest_checkpoint_one_rank_cannot_read_makes_both_fall_back_and_still_resume_bit_exactly(runs):
    dirs, codes = runs
    assert codes[5] == 0
    stop = str(dirs["fallback"] / "checkpoints" / f"step_{STOP:08d}")
    for r in (0, 1):  # the same decision on both ranks, though only rank 1 failed to read
        resumed = result(dirs["fallback"], r)["model_info"]["resumed_from"]
        assert resumed["step"] == 4 and [s["path"] for s in resumed["skipped"]] == [stop]
    assert "JSONDecodeError" in result(dirs["fallback"], 1)["model_info"]["resumed_from"]["skipped"][0]["why"]
    assert [r["step"] for r in history(dirs["fallback"])] == list(range(5, STEPS + 1))
    assert differences(dirs["full"], dirs["fallback"]) == []


def test_keep_last_is_honoured_across_the_resume(runs):
    dirs, _ = runs
    # attempt 1 wrote 2, 4 and the stop checkpoint 5; attempt 2 adopted them and wrote 6, 8, 10
    left = sorted(p.name for p in (dirs["stopped"] / "checkpoints").iterdir())
    assert left == ["step_00000008", "step_00000010"]


def test_the_stop_checkpoint_is_complete_and_says_why(runs):
    dirs, _ = runs
    from align.control.ckpt_index import problem

    ckpt = dirs["swapped"] / "checkpoints" / f"step_{STOP:08d}"  # the copy of the stop checkpoint
    assert problem(ckpt) is None
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["reason"] == "stop" and meta["step"] == STOP and meta["world_size"] == 2
    assert meta["state"]["step"] == STOP
    for r in (0, 1):
        rank = json.loads((ckpt / f"rank{r}.json").read_text())
        assert rank["stream"]["index"] == STOP * ACCUM  # micro-batches this rank consumed


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_expert_parallel_and_8bit_adamw_resume_bit_exactly_too(runs, name):
    dirs, codes = runs
    at = 7 + 3 * sorted(VARIANTS).index(name)
    assert codes[at:at + 3] == [0, 143, 0]
    assert [r["step"] for r in history(dirs[f"{name}_stopped"])] == list(range(1, 7))
    assert differences(dirs[f"{name}_full"], dirs[f"{name}_stopped"]) == []
    info = result(dirs[f"{name}_stopped"], 0)["model_info"]
    assert info["resumed_from"]["step"] == 3
    if name == "adamw8bit":
        assert info["optimizer_impl"] == "torchao.optim.adam.AdamW8bit"
    else:  # the export gathered every expert from both ranks, in the hub layout transformers loads
        assert info["parallel"]["ep_size"] == 2
        sd = load_file(dirs[f"{name}_full"] / "export" / "model.safetensors")
        assert {k.split(".")[5] for k in sd if ".mlp.experts." in k} == {str(e) for e in range(8)}


# ------------------------------------------------------------------ through the CLI, one process

CLI = ["allow_dirty=true", "logger=none", "trainer.device=cpu", "data.max_records=32", "data.max_seq_len=64",
       "data.truncation=truncate", "sampler=shuffle", "sampler.micro_batch_size=2", "optimizer.warmup_ratio=0",
       "trainer.log_every=1000"]
RUN = CLI + ["trainer.max_steps=6", "trainer.save_every=2", "trainer.keep_last=0", "trainer.export=true"]

# `python -m align.train` that sends itself a SIGTERM while it computes step 5 (deterministic, unlike a timed kill)
STOPPED_IN_STEP_5 = (
    "import os, runpy, signal, sys\n"
    "import align.trainer as t\n"
    "step = t.Trainer.train_step\n"
    "def train_step(self, batches):\n"
    "    if self.state.step == 4:\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "    return step(self, batches)\n"
    "t.Trainer.train_step = train_step\n"
    "sys.argv = ['align.train'] + sys.argv[1:]\n"
    "runpy.run_module('align.train', run_name='__main__')\n"
)


def train(run_dir: Path, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli("align.train", f"hydra.run.dir={run_dir}", *overrides, timeout=300, env=env)


def error_lines(p: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if ln.startswith("align: error:")]


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run dir, train.log and the exit records included."""
    return {str(f.relative_to(run_dir)): f.read_bytes() for f in sorted(run_dir.rglob("*")) if f.is_file()}


def truncate(f: Path, size: int) -> None:
    with open(f, "r+b") as fh:
        fh.truncate(size)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> Path:
    """A 6-step run stopped during step 5: checkpoints at 2 and 4, the stop's at 5, no export (exit 143)."""
    d = tmp_path_factory.mktemp("cli") / "interrupted"
    p = subprocess.run([sys.executable, "-c", STOPPED_IN_STEP_5, f"hydra.run.dir={d}", *RUN], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 143, p.stderr[-3000:]
    assert [s.name for s in sorted((d / "checkpoints").iterdir())] == [f"step_{s:08d}" for s in (2, 4, 5)]
    return d


@pytest.fixture(scope="module")
def finished(interrupted, tmp_path_factory) -> Path:
    """The interrupted run resumed by the same command to its end (exit 0, an export)."""
    d = tmp_path_factory.mktemp("cli") / "finished"
    shutil.copytree(interrupted, d)
    p = train(d, *RUN)
    assert p.returncode == 0, p.stderr[-3000:]
    return d


def test_the_same_command_resumes_an_interrupted_run_and_is_refused_on_the_finished_one_untouched(finished, tmp_path):
    m = json.loads((finished / "provenance.json").read_text())
    assert m["model"]["extra"]["resumed_from"]["step"] == 5 and m["run"]["exit_code"] == 0
    assert [r["step"] for r in history(finished)] == list(range(1, 7)) and (finished / "export").is_dir()
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    before = snapshot(d)
    p = train(d, *RUN, env={"ALIGN_EXIT_DIR": str(tmp_path / "exits")})
    assert p.returncode == 2, p.stderr[-3000:]
    assert error_lines(p) == [ln for ln in p.stderr.splitlines() if ln.strip()]  # one line, no traceback
    [line] = error_lines(p)
    assert line.startswith(f"align: error: hydra.run.dir: {d} holds a finished run (provenance.json: complete, "
                           "exit 0; export/; rank0/exit.json: exit 0) and a finished run dir is never written again")
    assert line.endswith(f"trainer.resume_from={d / 'checkpoints' / 'step_00000006'}")
    assert snapshot(d) == before  # every file, train.log and rank0/exit.json included
    assert not (d / ".hydra.pending").exists()
    assert json.loads((tmp_path / "exits" / "rank0" / "exit.json").read_text())["code"] == 2  # for a launcher


@pytest.mark.parametrize("entry,overrides", [
    ("train", ["optimizer.lr=1e-3", "trainer.resume=never"]),
    ("eval", ["eval=gsm8k", "allow_dirty=true"]),
    ("probe", ["probe=mask"]),
])
def test_no_other_command_writes_into_a_finished_run_dir(finished, capsys, entry, overrides):
    import align.evaluation.config  # noqa: F401  (align.eval registers its schema on import)
    from align.run.cli import checked_run_dirs

    before = snapshot(finished)
    extra = [f"model_dir={finished / 'export'}"] if entry == "eval" else []
    with pytest.raises(SystemExit) as e:
        checked_run_dirs([f"hydra.run.dir={finished}", *extra, *overrides], entry, resumes=entry == "train")
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(err) == 1 and f"{finished} holds a finished run" in err[0], err
    assert snapshot(finished) == before


def test_a_resume_refused_for_other_data_leaves_the_run_it_would_continue_as_it_was(interrupted, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(interrupted, d)
    before = snapshot(d)
    p = train(d, *RUN, "data.max_records=24", env={"ALIGN_EXIT_DIR": str(tmp_path / "exits")})
    assert p.returncode == 2, p.stderr[-3000:]
    [line] = error_lines(p)
    assert "refusing to resume" in line and "dataset_fingerprint was" in line and "Traceback" not in p.stderr
    # provenance.json, .hydra/, history, checkpoints, and the attempt's own train.log lines and exit record
    assert snapshot(d) == before
    assert not (d / ".hydra.pending").exists()
    assert json.loads((tmp_path / "exits" / "rank0" / "exit.json").read_text())["code"] == 2  # for a launcher


def test_a_corrupt_newest_checkpoint_falls_back_to_one_that_loads_and_none_loading_is_refused(
        interrupted, finished, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(interrupted, d)
    ck = d / "checkpoints"
    truncate(ck / "step_00000005" / "model" / "__0_0.distcp", 1000)
    truncate(ck / "step_00000004" / "optim" / ".metadata", 100)
    log_before = (d / "train.log").read_text()
    p = train(d, *RUN)
    assert p.returncode == 0, p.stderr[-3000:]
    logged = p.stdout + p.stderr  # Hydra's console log goes to stdout
    assert "step_00000005 does not load (ValueError: model/__0_0.distcp is 1000 bytes" in logged
    assert "step_00000004 does not load (ValueError: optim/.metadata is unreadable" in logged
    m = json.loads((d / "provenance.json").read_text())
    resumed = m["model"]["extra"]["resumed_from"]
    assert resumed["step"] == 2
    assert [Path(s["path"]).name for s in resumed["skipped"]] == ["step_00000005", "step_00000004"]
    # the accepted attempt's record replaced the earlier one (staged until the resume was decided)
    assert m["run"]["run_dir"] == str(d.resolve()) and m["status"] == "complete" and not (d / ".hydra.pending").exists()
    # its log (staged until then too) follows the earlier attempt's in train.log
    log = (d / "train.log").read_text()
    assert log.startswith(log_before) and "step_00000005 does not load" in log.removeprefix(log_before)
    assert [r["step"] for r in history(d)] == list(range(1, 7))
    a, b = load_file(finished / "export" / "model.safetensors"), load_file(d / "export" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the fallback resume is exact

    d = tmp_path / "none_loads"
    shutil.copytree(interrupted, d)
    for s in (2, 4, 5):
        truncate(d / "checkpoints" / f"step_{s:08d}" / "model" / "__0_0.distcp", 10)
    p = train(d, *RUN)
    assert p.returncode == 2, p.stderr[-3000:]
    [line] = error_lines(p)
    assert line.startswith("align: error: trainer.resume: no checkpoint loads:") and "Traceback" not in p.stderr
    assert all(f"step_{s:08d}: ValueError: model/__0_0.distcp is 10 bytes" in line for s in (2, 4, 5))


def test_a_restart_after_a_kill_before_any_checkpoint_keeps_one_history_row_per_step(tmp_path):
    d = tmp_path / "run"
    args = [f"hydra.run.dir={d}", *CLI, "trainer.save_every=0", "trainer.export=false"]
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "align.train", *args, "trainer.max_steps=100000"], cwd=REPO,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while not ((d / "history.jsonl").is_file() and len(history(d)) >= 2):
                alive = proc.poll() is None and time.monotonic() < deadline
                assert alive, (tmp_path / "killed.log").read_text()[-2000:]
                time.sleep(0.2)
        finally:
            proc.kill()  # by the PID we started
            proc.wait(30)
    killed = [r["step"] for r in history(d)]
    assert not (d / "checkpoints").exists()
    p = run_cli("align.train", *args, "trainer.max_steps=3", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert [r["step"] for r in history(d)] == [1, 2, 3]
    superseded = [json.loads(x)["step"] for x in (d / "history.superseded.jsonl").read_text().splitlines()]
    assert superseded == killed


def test_a_resume_with_dropout_draws_the_uninterrupted_runs_masks(tmp_path):
    """With dropout on, every mask comes from the global torch RNG the checkpoint restores: a resumed
    step must train on the same masks as the uninterrupted step (a DataLoader iterator that drew its
    seed from that RNG after the restore shifted every later mask)."""
    from tests.conftest import build_trainer

    base = ["trainer.device=cpu", "trainer.export=false", "data.max_seq_len=96", "data.truncation=truncate",
            "data.max_records=64", "sampler=shuffle", "sampler.micro_batch_size=2", "optimizer.warmup_ratio=0",
            "+model.overrides.attention_dropout=0.2", "trainer.max_steps=5"]
    whole = build_trainer(tmp_path / "whole", *base, "trainer.save_every=3")
    assert whole.fit() == 0
    ckpt = next((whole.run_dir / "checkpoints").glob("step_00000003"))
    resumed = build_trainer(tmp_path / "resumed", *base, f"trainer.resume_from={ckpt}")
    assert resumed.fit() == 0

    def losses(run_dir):
        return [json.loads(line)["loss"] for line in (run_dir / "history.jsonl").read_text().splitlines()]

    assert losses(resumed.run_dir) == losses(whole.run_dir)[3:]
