"""`python -m align.train objective=dpo` end to end, through the CLI, on the tiny model and the bundled pairs.

- It learns: 12 steps of 16 pairs (beta 0.5) over a pool of about 60 short pairs (3 epochs). The
  reward accuracy of each step's pairs, scored before that step's update (as TRL reports it), rises
  from chance to well above 0.5 and the margin grows. (On pairs it never saw, the tiny model needs
  many more steps for the same rise than a CI test should take.)
- Every step's row holds the loss, both rewards, the margin, the accuracy, both sides' log-probs and
  the truncated fraction, consistent with each other, in history.jsonl and in the offline W&B log
  (charted against train/step). The export loads with from_pretrained and differs from the starting
  weights, whose hash is the reference identity in the manifest, which is complete.
- reference=precomputed: the first run computes and caches (hit=false in its manifest). Under the
  supervisor, a run in a new run dir hits the same key, a real SIGTERM stops it (143, a stop
  checkpoint), the supervisor relaunches it, and the resume hits the same key again.
- reference=adapters_off (LoRA) records its base's identity; a reference-free loss (simpo) records
  the reference as null with its reason, and its gate's reference part likewise.
- A gate failure (a wrong reference planted before the real CLI runs) ends the run before step 1:
  exit 2, one line on stderr, and the manifest records the failed gate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO, recorded_run, run_cli
from tests.integration.test_truthful_run import assert_present_and_null
from tests.wandb_log import read_run

BASE = ["allow_dirty=true", "objective=dpo", "trainer.device=cpu", "trainer.log_every=1000",
        "optimizer.warmup_ratio=0", "data.max_seq_len=128", "data.truncation=drop", "data.on_bad_record=skip"]
SHORT = BASE + ["logger=none", "trainer.export=false", "data.max_records=40",
                "sampler=shuffle", "sampler.micro_batch_size=4"]
METRICS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy", "logps/chosen",
           "logps/rejected", "truncated_fraction", "pairs")

# Plants one break before the real `python -m align.train`: the frozen reference's embeddings perturbed.
WRONG_REFERENCE = (
    "import runpy, sys, torch\n"
    "import align.objectives.dpo as dpo\n"
    "prepare = dpo.DPO.prepare\n"
    "def perturbed(self, model):\n"
    "    extra = prepare(self, model)\n"
    "    with torch.no_grad():\n"
    "        for m in extra:\n"
    "            w = m.get_input_embeddings().weight\n"
    "            w.add_(0.05 * torch.randn_like(w))\n"
    "    return extra\n"
    "dpo.DPO.prepare = perturbed\n"
    "sys.argv = ['align.train'] + sys.argv[1:]\n"
    "runpy.run_module('align.train', run_name='__main__')\n"
)
# A real SIGTERM to the training process while it computes step 3, on the first attempt only (marker file).
SIGTERM_ONCE = (
    "import os, runpy, signal, sys\n"
    "from pathlib import Path\n"
    "import align.trainer as t\n"
    "marker = Path(os.environ['DPO_TEST_SIGNALLED'])\n"
    "step = t.Trainer.train_step\n"
    "def train_step(self, batches):\n"
    "    if self.state.step == 2 and not marker.exists():\n"
    "        marker.write_text(str(os.getpid()))\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "    return step(self, batches)\n"
    "t.Trainer.train_step = train_step\n"
    "sys.argv = ['align.train'] + sys.argv[1:]\n"
    "runpy.run_module('align.train', run_name='__main__')\n"
)


def train(run_dir: Path, *overrides: str, wrapper: str | None = None, env: dict | None = None):
    """`python -m align.train`, or the same through `wrapper` (a break planted first)."""
    args = [f"hydra.run.dir={run_dir}", *overrides]
    if wrapper is None:
        return run_cli("align.train", *args, timeout=600, env=env)
    return subprocess.run([sys.executable, "-c", wrapper, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})}, check=False)


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "provenance.json").read_text())


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines() if x.strip()]


def error_lines(p) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if ln.startswith("align: error:")]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dpo_cache") / "encode"


# --------------------------------------------------------------------------- the default learns


LEARN = BASE + ["logger=wandb", "logger.mode=offline", "trainer.export=true", "trainer.max_steps=12",
                "data.max_records=200", "sampler=shuffle", "sampler.micro_batch_size=16", "objective.beta=0.5"]


@pytest.fixture(scope="module")
def learned(tmp_path_factory, cache) -> Path:
    d = tmp_path_factory.mktemp("learn") / "run"
    p = train(d, *LEARN, f"data.cache_dir={cache}", env={"WANDB_MODE": "offline"})
    assert p.returncode == 0, p.stderr[-3000:]
    return d


def test_reward_accuracy_rises_well_above_chance_and_the_margin_grows(learned):
    h = rows(learned)
    assert [r["step"] for r in h] == list(range(1, 13)) and all(1 <= r["pairs"] <= 16 for r in h)
    assert h[-1]["epoch"] >= 2  # a pool of about 60 pairs, seen several times
    acc, margin = [r["rewards/accuracy"] for r in h], [r["rewards/margin"] for r in h]
    early_acc, late_acc = np.mean(acc[:3]), np.mean(acc[-3:])
    early_margin, late_margin = np.mean(margin[:3]), np.mean(margin[-3:])
    assert late_acc >= 0.85 and late_acc - early_acc >= 0.3, acc
    assert late_margin >= 1.0 and late_margin - early_margin >= 0.8, margin
    # step 1 is scored before any update: policy = reference, so every log-ratio is 0 and the loss log 2
    assert h[0]["rewards/margin"] == 0.0 and h[0]["loss"] == pytest.approx(np.log(2), abs=1e-6)


def test_every_row_holds_the_preference_metrics_consistently_in_history_and_wandb(learned):
    h = rows(learned)
    for r in h:
        assert all(k in r for k in METRICS), sorted(r)
        assert r["rewards/margin"] == pytest.approx(r["rewards/chosen"] - r["rewards/rejected"], abs=1e-5)
        assert 0.0 <= r["rewards/accuracy"] <= 1.0 and 0.0 <= r["truncated_fraction"] <= 1.0
        assert r["rewards/accuracy"] * r["pairs"] == pytest.approx(round(r["rewards/accuracy"] * r["pairs"]), abs=1e-4)
        assert r["logps/chosen"] < 0 and r["logps/rejected"] < 0
        assert r["truncated_fraction"] == 0.0  # data.truncation=drop: no pair is cut
    (wb,) = [read_run(x) for x in (learned / "wandb").glob("offline-run-*")]
    logged = {x["train/step"]: x for x in wb["history"] if "train/loss" in x}
    assert sorted(logged) == [r["step"] for r in h]
    for r in h:
        x = logged[r["step"]]
        assert x["train/loss"] == pytest.approx(r["loss"])
        for k in METRICS[1:7]:
            assert x[k] == pytest.approx(r[k]), k
        assert x["train/truncated_fraction"] == r["truncated_fraction"] and x["train/pairs"] == r["pairs"]
    charted = {m["glob"]: m["step_metric"] for m in wb["metrics"] if m["glob"]}
    assert charted["rewards/*"] == charted["logps/*"] == "train/step"


def test_the_export_loads_and_differs_from_the_starting_weights_the_manifest_names(learned, cache):
    from transformers import AutoModelForCausalLM

    from align.config import to_typed
    from align.objectives.reference import weights_sha256
    from align.run.cli import compose
    from tests.conftest import build_tiny

    m = manifest(learned)
    assert_present_and_null(m)
    assert m["status"] == "complete" and m["run"]["exit_code"] == 0
    ref = m["objective"]["reference"]
    # the run reads many epochs of its pairs, so auto precomputes the starting policy's log-probs
    assert (ref["requested"], ref["resolved"], ref["dtype"]) == ("auto", "precomputed", None) and ref["cache_key"]
    assert "epochs of the pairs" in ref["why"]
    assert ref["path"] is None and "random init" in ref["path_why_null"]
    gate = m["objective"]["gate"]
    assert gate["ran"] and gate["batching_ok"] and gate["reference_ok"] and gate["pairs"] == rows(learned)[0]["pairs"]

    cfg = to_typed(compose(LEARN))
    start = build_tiny(cfg.model, cfg.attention, seed=cfg.trainer.seed).model  # seeded as Trainer.build seeds it
    assert weights_sha256(start) == ref["weights_sha256"]  # the identity is the starting model's
    exported = AutoModelForCausalLM.from_pretrained(learned / "export", local_files_only=True)
    a, b = start.state_dict(), exported.state_dict()
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    moved = [k for k in a if not torch.equal(a[k], b[k])]
    assert len(moved) > len(a) // 2, moved  # it trained

    # a run that starts from this export names it as its reference, with the export's own weights hash
    from align.trainer import Trainer

    export = learned / "export"
    unlogged = [o for o in LEARN if not o.startswith("logger")]  # logger=none reads no logger.mode
    again = to_typed(compose([*unlogged, "logger=none", f"data.cache_dir={cache}", f"model.pretrained={export}"]))
    ref2 = Trainer.build(again, learned.parent / "from_export").objective.describe()["reference"]
    assert (ref2["path"], ref2["path_why_null"]) == (str(export), None)
    assert ref2["weights_sha256"] == weights_sha256(exported) != ref["weights_sha256"]


# ------------------------------------------------------------------------------ precomputed


def precomputed(cache: Path, *extra: str) -> list[str]:
    return [*SHORT, "objective.reference=precomputed", f"data.cache_dir={cache}", *extra]


@pytest.fixture(scope="module")
def first_precomputed(tmp_path_factory, cache) -> Path:
    d = tmp_path_factory.mktemp("pre") / "first"
    p = train(d, *precomputed(cache, "trainer.max_steps=1"))
    assert p.returncode == 0, p.stderr[-3000:]
    return d


def test_precomputed_computes_first_then_a_new_run_dir_and_a_supervised_resume_hit_the_same_key(
        first_precomputed, cache, tmp_path):
    ref = manifest(first_precomputed)["objective"]["reference"]
    key = ref["cache_key"]
    assert ref["resolved"] == "precomputed" and ref["cache_hit"] is False and len(key) == 16
    assert Path(ref["cache_path"]) == cache.parent / "reference" / f"{key}.npy" and Path(ref["cache_path"]).is_file()
    assert ref["weights_sha256"] and manifest(first_precomputed)["objective"]["gate"]["reference_ok"]

    d = tmp_path / "supervised"
    cmd = [sys.executable, "-c", SIGTERM_ONCE, f"hydra.run.dir={d}", *precomputed(cache, "trainer.max_steps=4")]
    p = run_cli("align.tools.supervise", "--backoff", "0.1", "--", *cmd, timeout=600,
                env={"DPO_TEST_SIGNALLED": str(tmp_path / "signalled")})
    assert p.returncode == 0, p.stderr[-3000:]
    events = [json.loads(x) for x in (d / "supervisor.jsonl").read_text().splitlines()]
    assert [e["code"] for e in events if e["event"] == "exit"] == [143, 0]
    assert (tmp_path / "signalled").is_file()
    log = (d / "train.log").read_text()  # both attempts append to it
    assert log.count(f"reference: precomputed {key} (cache hit)") == 2 and "(computed)" not in log
    m = manifest(d)  # the resumed attempt's
    ref2 = m["objective"]["reference"]
    assert (ref2["cache_key"], ref2["cache_hit"], ref2["weights_sha256"]) == (key, True, ref["weights_sha256"])
    assert m["objective"]["gate"] == {"ran": False, "why": "resumed: the policy has trained since step 0"}
    assert m["model"]["extra"]["resumed_from"]["step"] == 3 and m["run"]["exit_code"] == 0
    assert [r["step"] for r in rows(d)] == [1, 2, 3, 4]


# -------------------------------------------------------------------- adapters_off, reference-free


def test_adapters_off_records_the_base_identity_and_passes_its_gate(tmp_path, cache):
    # in-process (tests/conftest.py recorded_run): what is held is the manifest, not the CLI's exit
    _, d = recorded_run(tmp_path, [*SHORT, "model.lora.enabled=true", "trainer.max_steps=1", f"data.cache_dir={cache}"])
    m = manifest(d)
    assert m["run"]["exit_code"] == 0
    ref = m["objective"]["reference"]
    assert (ref["requested"], ref["resolved"], ref["dtype"], ref["cache_key"]) == ("auto", "adapters_off", None, None)
    assert len(ref["weights_sha256"]) == 64 and ref["path"] is None
    assert m["objective"]["gate"]["reference_ok"] and m["model"]["extra"]["lora"]


def test_a_reference_free_loss_records_the_reference_as_null_with_its_reason(tmp_path, cache):
    # Sides that differ at their start, half of them longer than data.max_seq_len: cut, they still differ
    # (the bundled pairs differ at their end, so a cut one is the same sequence twice and is skipped).
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"question {i}", "chosen": f"yes {i} " + "because " * 200 * (i % 2),
                                         "rejected": f"no {i} " + "because " * 200 * (i % 2)}) + "\n"
                             for i in range(40)))
    _, d = recorded_run(tmp_path, [*SHORT, "objective.loss=simpo", "trainer.max_steps=2", "data.truncation=truncate",
                                   "data=preference", f"data.path={pairs}", f"data.cache_dir={cache}"])
    assert manifest(d)["run"]["exit_code"] == 0
    obj = manifest(d)["objective"]
    ref, gate = obj["reference"], obj["gate"]
    assert ref["resolved"] is None and ref["why_null"] == "loss=simpo is reference-free"
    assert ref["weights_sha256"] is None and ref["path"] is None and ref["path_why_null"] == ref["why_null"]
    assert gate["batching_ok"] is True and gate["reference_ok"] is None
    assert gate["reference_why_null"] == "loss=simpo is reference-free: no log-ratio to check"
    h = rows(d)
    assert obj["data"]["truncated_pairs"] > 0 and any(r["truncated_fraction"] > 0 for r in h)
    assert all(r["truncated_fraction"] * r["pairs"] == pytest.approx(round(r["truncated_fraction"] * r["pairs"]))
               for r in h)


# ------------------------------------------------------------------------------------ the gate


def test_a_gate_failure_exits_2_with_one_line_and_the_manifest_records_it(tmp_path, cache):
    d = tmp_path / "wrong"
    p = train(d, *SHORT, "trainer.max_steps=2", f"data.cache_dir={cache}", wrapper=WRONG_REFERENCE)
    assert p.returncode == 2, p.stderr[-3000:]
    [line] = error_lines(p)
    assert line.startswith("align: error: objective gate: the policy differs from its reference at step 0 by ")
    assert line.endswith("(wrong reference)") and "Traceback" not in p.stderr
    m = manifest(d)
    assert m["status"] == "complete" and m["run"]["exit_code"] == 2 and "GateError" in m["run"]["exit_reason"]
    assert m["objective"]["gate"] == {"ran": True, "ok": False, "error": line.removeprefix("align: error: ")}
    assert rows(d) == [] and not (d / "checkpoints").exists()  # not one step trained


# ----------------------------------------------------------------------- pairs the cut makes identical


def test_a_file_whose_pairs_all_collapse_under_truncation_cannot_start(tmp_path):
    """Sides that differ only past data.max_seq_len are one sequence once cut (loss log 2, no gradient):
    such a file trained to exit 0 at loss 0.6931. Now the first such pair is refused by file:line
    (exit 2, one line) and not one step is taken."""
    shared = "the same long reasoning " * 12
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"q{i}", "chosen": shared + "yes", "rejected": shared + "no"}) + "\n"
                             for i in range(8)))
    d = tmp_path / "run"
    p = train(d, "allow_dirty=true", "objective=dpo", "logger=none", "trainer.device=cpu", "trainer.max_steps=2",
              "data=preference", f"data.path={pairs}", "data.max_seq_len=40", "data.truncation=truncate",
              f"data.cache_dir={tmp_path / 'cache'}")
    assert p.returncode == 2, p.stderr[-3000:]
    [line] = error_lines(p)
    assert line.startswith(f"align: error: {pairs}:1: 'chosen' and 'rejected' differ only past data.max_seq_len=40")
    assert manifest(d)["run"]["exit_code"] == 2
    assert not (d / "history.jsonl").exists() and not (d / "export").exists()  # refused at the encode, before step 1
