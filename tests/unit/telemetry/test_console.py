"""What a person reads of a run (align/telemetry/console.py): the start block, each logged step with the
objective's own metrics, and the end summary, all in train.log (here a FileHandler on the root logger,
as Hydra's job logging opens it). A tiny DPO run and a tiny GRPO run, two steps each, in-process."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.conftest import recorded_run

DPO = ["objective=dpo", "trainer.device=cpu", "data.max_records=16", "sampler=shuffle", "sampler.micro_batch_size=4",
       "data.max_seq_len=128", "data.truncation=drop", "data.on_bad_record=skip"]
GRPO = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=4", "trainer.device=cpu",
        "data.max_records=16", "objective.kl_coef=0.05", "eval=gsm8k", "trainer.eval_every=2", "eval.limit=2",
        "eval.max_new_tokens=4"]


def logged_run(tmp_path: Path, overrides: list[str]) -> tuple[list[str], Path]:
    log_path = tmp_path / "train.log"
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root, align_log = logging.getLogger(), logging.getLogger("align")
    old = align_log.level
    root.addHandler(handler)
    align_log.setLevel(logging.INFO)
    try:
        _, run_dir = recorded_run(tmp_path, ["trainer.max_steps=2", "trainer.log_every=1", *overrides], export=True)
    finally:
        root.removeHandler(handler)
        align_log.setLevel(old)
        handler.close()
    return log_path.read_text().splitlines(), run_dir


def block(lines: list[str], head: str) -> str:
    (line,) = [ln for ln in lines if ln.startswith(head)]
    return line


@pytest.mark.parametrize("kind", ["dpo", "grpo"])
def test_the_start_block_the_steps_and_the_summary_reach_train_log(tmp_path, kind, monkeypatch):
    from matplotlib.figure import Figure

    panels: list[list[str]] = []
    save = Figure.savefig

    def savefig(fig, *args, **kwargs):  # what plots/loss.png shows: each panel's label
        panels.append([ax.get_ylabel() for ax in fig.axes])
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    cache = [f"data.cache_dir={tmp_path / 'cache'}"]  # a fresh reference precompute: its progress shows
    lines, run_dir = logged_run(tmp_path, DPO + cache if kind == "dpo" else GRPO)
    text = "\n".join(lines)
    assert block(lines, "model ").startswith("model     mistral MistralForCausalLM: ") and " trainable / " in text
    assert block(lines, "objective ").startswith(f"objective {kind} ")
    data = block(lines, "data  ")
    assert " records, " in data and " tokens, " in data and ("preference" if kind == "dpo" else "prompt") in data
    assert block(lines, "sampler ").endswith("budget 2 steps")
    assert block(lines, "device ") == "device    cpu x1"
    assert block(lines, "run dir ") == f"run dir   {run_dir}"
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert [s.split()[1] for s in steps] == ["1/2", "2/2"], text
    rows = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    if kind == "dpo":
        want = f"loss {rows[1]['loss']:.4f} reward acc {rows[1]['rewards/accuracy']:.4f} margin "
        assert steps[1].startswith(f"step 2/2 {want}"), steps
        assert block(lines, "objective ").endswith("watching: loss, reward acc, margin")
        pairs = json.loads((run_dir / "provenance.json").read_text())["data"]["encode_stats"]["pairs"]
        ref = "reference log-probs (pairs): "
        assert block(lines, ref + "started") == f"{ref}started ({pairs} to do)"
        assert block(lines, f"{ref}{pairs} done in ")
    else:
        assert steps[0].startswith(f"step 1/2 reward {rows[0]['reward/mean']:.4f} kl "), steps
        assert " logp mismatch " in steps[0] and " loss " not in steps[0]  # the surrogate is not the signal
        assert block(lines, "objective ").endswith("watching: reward, kl, logp mismatch")
        assert block(lines, "in-training eval: started") and block(lines, "in-training eval: done in ")
    done = block(lines, "done ")
    tokens = sum(r["tokens"] for r in rows)
    assert done.startswith(f"done      exit 0: 2 steps, {tokens:,} tokens in ") and "tokens/s)" in done
    assert block(lines, "final ") == "final     " + steps[1].removeprefix("step 2/2 ").split(" tok/s")[0]
    assert block(lines, "export ") == f"export    {run_dir / 'export'}"
    assert block(lines, "manifest ") == f"manifest  {run_dir / 'provenance.json'}"
    want = ["loss", "reward acc", "margin"] if kind == "dpo" else ["reward", "kl", "logp mismatch"]
    assert panels == [[*want, "learning rate"]]  # plots/loss.png: a panel per console metric, the lr under them
    assert (run_dir / "plots" / "loss.png").is_file()


def test_a_resumed_runs_summary_counts_the_tokens_of_its_own_steps(tmp_path):
    """tokens/s is this attempt's tokens over this attempt's wall time, not the run's since step 1."""
    sft = ["trainer.device=cpu", "data.max_records=16", "trainer.save_every=2"]
    logged_run(tmp_path, sft)
    lines, run_dir = logged_run(tmp_path, [*sft, "trainer.max_steps=3"])
    rows = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    done = [ln for ln in lines if ln.startswith("done ")][-1]
    assert done.startswith(f"done      exit 0: 3 steps (resumed at 2), {rows[2]['tokens']:,} tokens in "), done
    assert [ln for ln in lines if ln.startswith("step ")][-1].startswith("step 3/3 loss ")
