"""objective=grpo through `python -m align.train`: the embedded default learns its task, and bad prompt
data is one line and exit 2."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli


def _mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.slow
@pytest.mark.parametrize("sampler", [[], ["sampler=budget", "sampler.max_tokens=512", "sampler.packed=true"]],
                         ids=["shuffle", "budget"])
def test_the_embedded_default_learns_the_addition_task(tmp_path, sampler):
    """`python -m align.train objective=grpo` as typed: the tiny random-init model's mean reward rises
    clearly from its first steps (where almost no completion scores) within the default run. A flipped
    advantage sign (the policy pushed away from what scored) fails this test. sampler=budget: the same,
    each step's completions packed into several micro-batches of at most 512 tokens."""
    run_dir = tmp_path / "run"
    p = run_cli("align.train", "objective=grpo", f"hydra.run.dir={run_dir}", "allow_dirty=true", *sampler)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    rewards = [r["reward/mean"] for r in rows]
    first, last = _mean(rewards[:5]), _mean(rewards[-10:])
    assert last >= 0.1 and last >= first + 0.08, (first, last, rewards)
    for key in ("time/generation_share", "rollout/tokens_per_s", "time/update_tokens_per_s", "mismatch/logp_abs_max",
                "mismatch/kl", "mismatch/is_ratio_std", "reward/zero_variance_frac"):
        assert all(r[key] is not None for r in rows), key
    assert max(r["mismatch/logp_abs_max"] for r in rows) < 1e-4  # fp32 CPU, shared weights: no mismatch
    manifest = json.loads((run_dir / "provenance.json").read_text())
    loss = manifest["model"]["extra"]["loss"]
    assert loss["kind"] == "grpo" and loss["is_correction"] == "none" and manifest["data"]["source"] == "add"
    assert (run_dir / "export" / "model.safetensors").is_file()


def test_a_budget_run_completes_and_records_its_micro_batches(tmp_path):
    """sampler=budget under objective=grpo through the CLI: several budget micro-batches per step, two
    updates per rollout, exit 0; trainer.grad_accum set beside it is one line, exit 2, before any work."""
    run_dir = tmp_path / "run"
    common = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4", "trainer.export=false",
              "logger=none", "allow_dirty=true", "sampler=budget", "sampler.max_tokens=64"]
    p = run_cli("align.train", *common, "objective.updates_per_rollout=2", "trainer.max_steps=3",
                f"hydra.run.dir={run_dir}")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["real_tokens"] > 64 for r in rows)  # a step holds more than one budget: it was cut
    p = run_cli("align.train", *common, "trainer.grad_accum=2", f"hydra.run.dir={tmp_path / 'refused'}")
    assert p.returncode == 2
    errors = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("align: error: trainer.grad_accum: ignored by objective=grpo "
                                                     "with sampler=budget"), errors
    assert not (tmp_path / "refused").exists()


def test_a_reference_the_reward_cannot_read_exits_2_naming_file_and_line(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1+1=", "reference": "2"}\n{"prompt": "1+2=", "reference": "three"}\n')
    p = run_cli("align.train", "objective=grpo", "data=jsonl_prompts", f"data.path={data}", "logger=none",
                "allow_dirty=true", f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("align: error:")]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"align: error: {data}:2: exact_int reference is not an integer"), errors
    assert not (tmp_path / "run" / "history.jsonl").exists()


def test_an_unknown_verifier_exits_2_before_any_work(tmp_path):
    p = run_cli("align.train", "objective=grpo", "+reward.weights.exactness=1.0", "logger=none",
                f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.strip()]
    assert errors == ["align: error: reward.weights.exactness: unknown verifier or function; accepted: exact_int, "
                      "format, gsm8k, math, a name of reward.functions, python with reward.function, or model "
                      "with reward.path (got 'exactness')"], errors
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------ FSDP and exact resume
# 2 gloo ranks (parallel=fsdp): 6 steps of 2 updates per rollout, uninterrupted vs stopped during step 3
# (mid-rollout: its second part is still in the buffer) and resumed. A reward that scores by text length
# stands in for the verifier so that a random model gets signal from the first step (with exact_int
# almost every advantage is 0 and nothing would move). The control resumes without the rollout buffer.

RESUME = ["objective=grpo", "logger=none", "trainer.device=cpu", "trainer.export=true", "trainer.log_every=1000",
          "parallel=fsdp", "objective.group_size=4", "objective.prompts_per_rollout=4",
          "objective.updates_per_rollout=2", "trainer.grad_accum=2", "trainer.max_steps=6", "data.max_records=200"]
STOP = 3


def dense_reward(trainer, rank: int, stop_on: int | None = None, forget_buffer: bool = False) -> None:
    from tests.grpo_rewards import LengthParity

    trainer.objective.reward = LengthParity()
    if forget_buffer:
        assert trainer.state.step == STOP and trainer.objective.rollout is not None
        trainer.objective.rollout = None  # the bug this guards: a resume that regenerates a half-used rollout
    if stop_on is not None and rank == stop_on:
        inner = trainer.train_step

        def train_step(batches):
            if trainer.state.step == STOP - 1:
                trainer.stop.request(f"test: stop during step {STOP}")
            return inner(batches)

        trainer.train_step = train_step


def copy_stop_checkpoint(rank: int, world: int, src: str, dst: str) -> None:
    import shutil

    import torch.distributed as dist

    if rank == 0:
        ckpt = Path(src) / "checkpoints" / f"step_{STOP:08d}"
        shutil.copytree(ckpt, Path(dst) / "checkpoints" / ckpt.name)
    dist.barrier()


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    """Every 2-rank GRPO run of this file, in one spawn of 2 processes (imports and the process group paid
    once): the exact-resume runs, then the lockstep and budget runs (their configs and hooks below)."""
    from tests.integration.distributed import fit_many, run

    root = tmp_path_factory.mktemp("grpo_fsdp")
    d = {k: str(root / k) for k in ("full", "stopped", "nobuffer", "lockstep", "budget")}
    keep = ["trainer.save_every=2"]
    jobs = [
        {"run_dir": d["full"], "overrides": RESUME, "hook": dense_reward},
        {"run_dir": d["stopped"], "overrides": RESUME + keep, "hook": functools.partial(dense_reward, stop_on=1),
         "after": functools.partial(copy_stop_checkpoint, src=d["stopped"], dst=d["nobuffer"])},
        {"run_dir": d["stopped"], "overrides": RESUME + keep, "hook": dense_reward},
        {"run_dir": d["nobuffer"], "overrides": RESUME, "hook": functools.partial(dense_reward, forget_buffer=True)},
        {"run_dir": d["lockstep"], "overrides": LOCKSTEP, "hook": stop_at_once_on_rank0},
        {"run_dir": d["budget"], "overrides": BUDGET, "hook": record_cuts},
    ]
    codes = run(fit_many, 2, jobs, str(root / "codes.json"), timeout=1200)
    assert codes == [0, 0]
    return {k: Path(v) for k, v in d.items()}, json.loads((root / "codes.json").read_text())


def _differences(ref: Path, other: Path) -> list[str]:
    import torch
    from safetensors.torch import load_file

    from tests.integration.distributed import history

    out = []
    mine = {r["step"]: r["loss"] for r in history(other)}
    for r in history(ref):
        if r["step"] in mine and mine[r["step"]] != r["loss"]:
            out.append(f"loss at step {r['step']}: {r['loss']!r} vs {mine[r['step']]!r}")
    a, b = load_file(ref / "export" / "model.safetensors"), load_file(other / "export" / "model.safetensors")
    return out + [f"param {k}" for k in a if not torch.equal(a[k], b[k])]


def test_fsdp_stop_mid_rollout_then_resume_is_bit_identical(fsdp_runs):
    from tests.integration.distributed import history, result

    dirs, codes = fsdp_runs
    assert codes[:3] == [0, 143, 0]
    rows = history(dirs["stopped"])
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert _differences(dirs["full"], dirs["stopped"]) == []
    assert result(dirs["stopped"], 1)["model_info"]["resumed_from"]["step"] == STOP
    full = history(dirs["full"])
    assert any(r["loss"] != 0 for r in full) and full[0]["rollout/sequences"] == 2 * 4 * 4  # both ranks' rollouts
    assert [r["rollout/index"] for r in full if "rollout/index" in r] == [0, 1, 2]  # steps 1, 3, 5 generate
    # the copy of the stop checkpoint (the resumed run pruned its own)
    ckpt = json.loads((dirs["nobuffer"] / "checkpoints" / f"step_{STOP:08d}" / "rank1.json").read_text())
    assert ckpt["objective"]["rollout"]["served"] == 1  # the stop fell between the rollout's two updates


def test_negative_control_a_resume_without_the_rollout_buffer_is_detected(fsdp_runs):
    dirs, codes = fsdp_runs
    assert codes[3] == 0
    diff = _differences(dirs["full"], dirs["nobuffer"])
    assert any(x.startswith("loss") for x in diff) and any(x.startswith("param") for x in diff), diff


def stop_at_once_on_rank0(trainer, rank: int) -> None:
    if rank == 0:  # every token ends a completion: rank 0 finishes decoding after one token, rank 1 never
        vocab = trainer.model.get_input_embeddings().num_embeddings
        trainer.objective.engine.eos_token_ids = tuple(range(vocab))


LOCKSTEP = RESUME[:-1] + ["trainer.max_steps=2", "trainer.export=false", "parallel.pg_timeout_s=60"]


def test_fsdp_ranks_whose_completions_end_at_different_lengths_decode_in_lockstep(fsdp_runs):
    """Each decode step is a collective forward of the sharded model: a rank that has finished keeps
    stepping until every rank has (else the other rank waits in an all-gather that never comes)."""
    from tests.integration.distributed import history, result

    dirs, _ = fsdp_runs
    assert [result(dirs["lockstep"], r)["code"] for r in (0, 1)] == [0, 0]
    rows = history(dirs["lockstep"])
    assert len(rows) == 2 and 1 < rows[0]["rollout/completion_len_mean"] < 4  # rank 0: 1 token, rank 1: 4


def test_non_finite_losses_halt_a_grpo_run_with_exit_81(tmp_path):
    run_dir = tmp_path / "run"
    p = run_cli("align.train", "objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4",
                "trainer.max_consecutive_skipped_steps=2", "trainer.export=false", "logger=none", "allow_dirty=true",
                f"hydra.run.dir={run_dir}", env={"ALIGN_TEST_INJECT_NAN": "0:1-"})
    assert p.returncode == 81, p.stderr[-2000:]
    halt = json.loads((run_dir / "HALT.json").read_text())
    assert halt["step"] == 3
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in rows] == [True, True, True] and all("reward/mean" in r for r in rows)


# ------------------------------------------------------------------------ sampler=budget over ranks
# Rank 0's completions end after one token, rank 1's run to max_new_tokens: the budget cuts rank 0's shorter
# sequences into fewer micro-batches, and every rank must still run as many forwards (FSDP's are collective).

BUDGET = ["objective=grpo", "logger=none", "trainer.device=cpu", "trainer.export=false", "parallel=fsdp",
          "objective.group_size=4", "objective.prompts_per_rollout=4", "trainer.max_steps=2", "data.max_records=200",
          "parallel.pg_timeout_s=60", "sampler=budget", "sampler.max_tokens=64", "sampler.pad_to_multiple_of=1"]


def record_cuts(trainer, rank: int) -> None:
    stop_at_once_on_rank0(trainer, rank)
    obj, log = trainer.objective, []
    out = Path(trainer.run_dir) / f"rank{rank}" / "cuts.json"
    agree, next_window = obj._agree_counts, obj.next_window

    def spy_agree(counts):
        agreed = agree(counts)
        log.append({"local": list(counts), "agreed": list(agreed)})
        return agreed

    def spy_window(batches, n, device):
        window = next_window(batches, n, device)
        log.append({"window": len(window), "sizes": [b.n_seq for b in window]})
        out.write_text(json.dumps(log))
        return window

    obj._agree_counts, obj.next_window = spy_agree, spy_window


def test_fsdp_ranks_agree_on_the_budget_micro_batch_count(fsdp_runs):
    from tests.integration.distributed import history, result

    dirs, _ = fsdp_runs
    run_dir = dirs["budget"]
    assert [result(run_dir, r)["code"] for r in (0, 1)] == [0, 0]
    logs = [json.loads((run_dir / f"rank{r}" / "cuts.json").read_text()) for r in range(2)]
    cuts = [[e for e in log if "agreed" in e] for log in logs]
    windows = [[e for e in log if "window" in e] for log in logs]
    assert len(cuts[0]) == len(cuts[1]) == 2 and len(windows[0]) == len(windows[1]) == 2
    for a, b in zip(*cuts):
        assert a["agreed"] == b["agreed"] == [max(x, y) for x, y in zip(a["local"], b["local"])]
    assert any(a["local"] != b["local"] for a, b in zip(*cuts)), cuts  # the evening-out was exercised
    for log_w, log_c in zip(windows, cuts):
        assert [w["window"] for w in log_w] == [c["agreed"][0] for c in log_c]
        assert all(min(w["sizes"]) >= 1 and sum(w["sizes"]) == 16 for w in log_w)
    assert len(history(run_dir)) == 2
