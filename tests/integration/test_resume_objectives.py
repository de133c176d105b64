"""Bit-exact resume for the objectives the 2-rank tests do not cover (tests/integration/test_resume_exact.py
for SFT, test_dpo_distributed.py for DPO, test_grpo.py for single-turn GRPO): KTO, on-policy distillation,
the reward model and multi-turn GRPO with the bundled calculator tool. Each runs in-process on the CPU
(tiny models, one process): 6 steps uninterrupted vs a stop requested during step 3 (its checkpoint
written, exit 143) and the same command resumed in the same run dir. Every history row (all but its
timings) and every final parameter must equal the uninterrupted run's bit for bit.

Each objective has negative controls, so the comparison is shown to see the difference it exists for:
a resume from a copy of the stop checkpoint with one piece of its state dropped after the load must
differ. KTO and the reward model: the sampler position (KTO's KL reference point has no state of its own:
each micro-batch's KL sequences give it), and for the reward model its step count (the held-out accuracy
then lands on other steps), while another held-out split is other training data and refused. Distillation
and multi-turn GRPO stop mid-rollout (two updates per rollout): the rollout buffer, and the rollout count
their sampling seeds (every turn's, for multi-turn) derive from. Distillation resumed against another
teacher is refused.

Multi-turn GRPO rolls out through `CalculatorFirst`: the real engine on the run's model, except that two
of each prompt's four trajectories open with a scripted calculator call (an untrained tiny model never
makes one); the tool runs, its message is a hole in the loss mask, and the next turn is the real
engine's, seeded from the rollout's seed and the turn (align/objectives/multi_turn.py) for one of them,
while the other answers with the tool's result, so the real verifier scores 1 in every group.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import torch

from align.errors import ConfigError
from align.generation import Completion, FinishReason
from align.rewards.tool_calls import OPEN
from tests.conftest import build_trainer
from tests.unit.objectives.conftest import TINY_DPO, teacher_checkpoint
from tests.unit.objectives.test_grpo_tools import CALC, _call

STEPS, STOP = 6, 3
COMMON = ["trainer.device=cpu", "trainer.export=false", f"trainer.max_steps={STEPS}", "trainer.keep_last=0",
          "optimizer.warmup_ratio=0"]
TIMING = ("_s", "_per_s", "/tokens_per_s", "tflops", "mfu_measured", "mfu_datasheet", "mem_peak_gib",
          "mem_alloc_retries", "generation_share")
"""Row keys that measure time or memory: the only ones a resumed run's rows may differ in."""


def _deterministic(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not (k.endswith(TIMING) or k.startswith("time/"))}


def _history(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


@dataclasses.dataclass
class Run:
    """A finished (or stopped) in-process run: its exit code, rows and final parameters."""

    code: int
    rows: list[dict[str, Any]]
    params: dict[str, torch.Tensor]
    trainer: Any


def _fit(root: Path, cfg: list[str], hook: Optional[Callable] = None, stop_at: Optional[int] = None) -> Run:
    """Build the trainer of run dir `root`/run (resuming whatever checkpoint it holds), apply `hook`
    (after the load: a control breaks the restored state there), fit, and return the run."""
    t = build_trainer(root, *cfg)
    if hook is not None:
        hook(t)
    if stop_at is not None:
        inner = t.train_step

        def train_step(batches):
            if t.state.step == stop_at - 1:
                t.stop.request(f"test: stop during step {stop_at}")
            return inner(batches)

        t.train_step = train_step
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = t.fit()
    finally:  # a stopped fit keeps its handlers for the process's bookkeeping: give pytest its own back
        for s, h in handlers.items():
            signal.signal(s, h)
    params = {k: v.detach().clone() for k, v in t.model.state_dict().items()}
    return Run(code, _history(t.run_dir), params, t)


def differences(ref: Run, other: Run) -> list[str]:
    """Every way `other` departs from `ref`: a row of a step both logged (any key but a timing), or a
    final parameter."""
    mine = {r["step"]: _deterministic(r) for r in other.rows}
    out = []
    for r in ref.rows:
        theirs = mine.get(r["step"])
        if theirs is None:
            continue
        want = _deterministic(r)
        out += [f"{k} at step {r['step']}: {want.get(k)!r} vs {theirs.get(k)!r}" for k in sorted(want.keys() | theirs)
                if want.get(k) != theirs.get(k)]
    out += [f"param {k}" for k in ref.params if not torch.equal(ref.params[k], other.params[k])]
    return out


@dataclasses.dataclass
class Runs:
    full: Run
    resumed: Run
    controls: dict[str, Run]
    stop_checkpoint: Path


def stop_and_resume(root: Path, cfg: list[str], hook: Optional[Callable] = None,
                    controls: Optional[dict[str, Callable]] = None) -> Runs:
    """The uninterrupted run, the stopped one and its resume, and each control (a resume from a copy of
    the stop checkpoint, `hook` then the control applied after the load)."""
    full = _fit(root / "full", cfg, hook)
    stopped = _fit(root / "stopped", cfg, hook, stop_at=STOP)
    assert stopped.code == 143 and [r["step"] for r in stopped.rows] == list(range(1, STOP + 1))
    ckpt = stopped.trainer.run_dir / "checkpoints" / f"step_{STOP:08d}"
    saved = root / "stop" / ckpt.name
    shutil.copytree(ckpt, saved)

    def then(control: Callable) -> Callable:
        def both(t):
            if hook is not None:
                hook(t)
            assert t.state.step == STOP, "a control starts from the resumed checkpoint"
            control(t)
        return both

    resumed = _fit(root / "stopped", cfg, hook)
    out = {}
    for name, control in (controls or {}).items():
        shutil.copytree(saved, root / name / "run" / "checkpoints" / saved.name)
        out[name] = _fit(root / name, cfg, then(control))
    return Runs(full, resumed, out, saved)


def assert_bit_exact(runs: Runs) -> None:
    assert runs.full.code == 0 and runs.resumed.code == 0
    assert [r["step"] for r in runs.resumed.rows] == list(range(1, STEPS + 1))  # one row per step, both attempts
    assert runs.resumed.trainer.model_info["resumed_from"]["step"] == STOP
    assert differences(runs.full, runs.resumed) == []


def assert_differs_from(diff: list[str], first: int) -> None:
    """A control's rows equal the uninterrupted run's up to step `first`, whose row differs (the step its
    missing state is first read), and its final parameters differ."""
    steps = {int(d.partition(" at step ")[2].partition(":")[0]) for d in diff if " at step " in d}
    assert min(steps, default=None) == first and any(d.startswith("param") for d in diff), diff


def forget_sampler_position(t) -> None:
    from align.data.loader import Position

    t.stream.position = Position()


# ------------------------------------------------------------------------------------------------ KTO

KTO = ["objective=kto", *TINY_DPO[1:], *COMMON, "objective.beta=0.2", "objective.desirable_weight=1.5"]


@pytest.fixture(scope="module", params=["model", "precomputed"])
def kto(tmp_path_factory, request):
    """With the reference a frozen copy, and precomputed (its table, made at the start, read from the
    cache by the resume)."""
    return stop_and_resume(tmp_path_factory.mktemp("kto"), [*KTO, f"objective.reference={request.param}"],
                           controls={"nosampler": forget_sampler_position})


def test_kto_stop_then_resume_is_bit_identical(kto):
    assert_bit_exact(kto)
    ref = kto.resumed.trainer.objective.describe()["reference"]
    assert ref["resolved"] == kto.full.trainer.objective.describe()["reference"]["resolved"]
    if ref["resolved"] == "precomputed":
        assert ref["cache_hit"] is True
    assert all(r["kl"] >= 0 for r in kto.full.rows) and any(r["kl"] > 0 for r in kto.full.rows)


def test_kto_negative_control_a_resume_without_the_sampler_position_differs(kto):
    diff = differences(kto.full, kto.controls["nosampler"])
    assert any(d.startswith("loss") for d in diff) and any(d.startswith("param") for d in diff), diff


# -------------------------------------------------------------------------------------- distillation

DISTILL = ["objective=distill", "objective.group_size=2", "objective.prompts_per_rollout=4",
           "objective.updates_per_rollout=2", "objective.max_new_tokens=16", "optimizer.lr=1e-3", *COMMON]


def drop_rollout_buffer(t) -> None:
    assert t.objective.rollout is not None and t.objective.rollout.served == 1  # the stop fell mid-rollout
    t.objective.rollout = None  # a resume that regenerates a half-used rollout


def forget_rollout_count(t) -> None:
    assert t.objective.rollouts == 2
    t.objective.rollouts = 0  # the next rollout (step 5) drawn with rollout 0's seeds


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return teacher_checkpoint(tmp_path_factory.mktemp("teacher") / "ckpt")


@pytest.fixture(scope="module")
def distill(tmp_path_factory, teacher):
    return stop_and_resume(tmp_path_factory.mktemp("distill"), [*DISTILL, f"objective.teacher={teacher}"],
                           controls={"nobuffer": drop_rollout_buffer, "noseeds": forget_rollout_count})


def test_distill_stop_mid_rollout_then_resume_is_bit_identical(distill):
    assert_bit_exact(distill)
    assert [r["rollout/index"] for r in distill.full.rows if "rollout/index" in r] == [0, 1, 2]


@pytest.mark.parametrize("control,first", [("nobuffer", 4), ("noseeds", 5)])
def test_distill_negative_controls_a_resume_without_the_rollout_buffer_or_its_seeds_differs(distill, control, first):
    assert_differs_from(differences(distill.full, distill.controls[control]), first)


def test_distill_a_resume_against_another_teacher_is_refused(distill, tmp_path):
    other = teacher_checkpoint(tmp_path / "other", seed=4)
    shutil.copytree(distill.stop_checkpoint, tmp_path / "run" / "checkpoints" / distill.stop_checkpoint.name)
    with pytest.raises(ConfigError) as e:
        build_trainer(tmp_path, *DISTILL, f"objective.teacher={other}")
    assert str(e.value).startswith("objective.teacher: the checkpoint was distilled from a teacher of weights sha256 ")
    assert "resume with the run's own teacher" in str(e.value) and "\n" not in str(e.value)


# -------------------------------------------------------------------------------------- reward model

REWARD_MODEL = ["objective=reward_model", *TINY_DPO[1:], *COMMON, "objective.eval_pairs=4", "objective.eval_every=2"]


def forget_step_count(t) -> None:
    assert t.objective.steps == STOP
    t.objective.steps = 0


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    return stop_and_resume(tmp_path_factory.mktemp("reward_model"), REWARD_MODEL,
                           controls={"nosampler": forget_sampler_position, "nosteps": forget_step_count})


def test_reward_model_stop_then_resume_is_bit_identical(reward_model):
    assert_bit_exact(reward_model)
    assert [r["step"] for r in reward_model.full.rows if "heldout/accuracy" in r] == [2, 4, 6]


def test_reward_model_negative_control_a_resume_without_the_sampler_position_differs(reward_model):
    diff = differences(reward_model.full, reward_model.controls["nosampler"])
    assert any(d.startswith("loss") for d in diff) and any(d.startswith("param") for d in diff), diff


def test_reward_model_negative_control_a_resume_without_its_step_count_moves_the_held_out_accuracy(reward_model):
    diff = differences(reward_model.full, reward_model.controls["nosteps"])
    assert diff and all(d.startswith("heldout/accuracy at step") for d in diff), diff


def test_reward_model_a_resume_on_another_held_out_split_is_refused(reward_model, tmp_path):
    shutil.copytree(reward_model.stop_checkpoint, tmp_path / "run" / "checkpoints" / reward_model.stop_checkpoint.name)
    with pytest.raises(ConfigError) as e:
        build_trainer(tmp_path, *REWARD_MODEL[:-2], "objective.eval_pairs=6", "objective.eval_every=2")
    assert "refusing to resume" in str(e.value) and "dataset_fingerprint was" in str(e.value)


# ------------------------------------------------------------------------------ multi-turn GRPO, tools

MULTI_TURN = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=2",
              "objective.updates_per_rollout=2", "objective.max_turns=3", f"objective.tools=[{CALC}]",
              "objective.max_new_tokens=16", "data.max_seq_len=256", "optimizer.lr=1e-3", *COMMON]


class CalculatorFirst:
    """The run's real engine, except for two scripted turns: of each prompt "<a>+<b>=", sample 0 calls the
    calculator on "a+b" and sample 1 on "(a+b)" (turn 1), and the turn after sample 0's tool message
    answers with the tool's result. Every other turn (samples 2 and 3, sample 1's second turn) is the
    engine's own sample, drawn from the call's seed."""

    def __init__(self, inner, tok) -> None:
        self.inner, self.tok = inner, tok

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _scripted(self, c: Completion, text: str) -> Completion:
        ids = tuple(self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
        lp = (-1.0,) * len(ids)  # read by the mismatch record only: the loss's old log-probs are the trainer's
        return Completion(c.prompt_index, c.sample_index, ids, lp, lp, FinishReason.stop)

    def generate(self, prompts, spec) -> list[Completion]:
        out = self.inner.generate(prompts, spec)
        for j, c in enumerate(out):
            text = self.tok.decode(list(prompts[c.prompt_index]), skip_special_tokens=False)
            if "<|tool|>" not in text and c.sample_index < 2:
                question = text.rpartition("<|user|>")[2].partition("<|end|>")[0].rstrip("=")
                out[j] = self._scripted(c, _call(question if c.sample_index == 0 else f"({question})"))
            elif "<|tool|>" in text and "(" not in text.rpartition(OPEN)[2]:
                out[j] = self._scripted(c, text.rpartition("<|tool|>")[2].partition("<|end|>")[0])
        return out


def calculator_first(t) -> None:
    if not isinstance(t.objective.engine, CalculatorFirst):
        t.objective.engine = CalculatorFirst(t.objective.engine, t.tokenizer)


@pytest.fixture(scope="module")
def multi_turn(tmp_path_factory):
    return stop_and_resume(tmp_path_factory.mktemp("multi_turn"), MULTI_TURN, calculator_first,
                           controls={"nobuffer": drop_rollout_buffer, "noseeds": forget_rollout_count})


def test_multi_turn_grpo_stop_mid_rollout_then_resume_is_bit_identical(multi_turn):
    assert_bit_exact(multi_turn)
    rows = [r for r in multi_turn.full.rows if "rollout/index" in r]
    assert [r["rollout/index"] for r in rows] == [0, 1, 2]
    # the calculator answered two trajectories of every four, one of which scored with its result
    assert all(r["rollout/tool_calls_mean"] == 0.5 and r["rollout/turns_mean"] == 1.5 for r in rows), rows
    assert all(r["reward/mean"] >= 0.25 for r in rows) and all(r["loss"] != 0 for r in multi_turn.full.rows)
    # the stop fell between the rollout's two updates, its buffer holding the tool messages' holes
    ckpt = json.loads((multi_turn.stop_checkpoint / "rank0.json").read_text())["objective"]["rollout"]
    assert ckpt["served"] == 1 and ckpt["loss_mask"] is not None


@pytest.mark.parametrize("control,first", [("nobuffer", 4), ("noseeds", 5)])
def test_multi_turn_negative_controls_a_resume_without_the_rollout_buffer_or_its_turn_seeds_differs(
        multi_turn, control, first):
    assert_differs_from(differences(multi_turn.full, multi_turn.controls[control]), first)
