"""The KTO, reward-model and distillation benches on the CPU: each align default arm and its TRL arm read what
the harness writes (the pairs, or the teacher it saves before the arms), the TRL arms need the pairs their
steps read and one command writes one teacher; a KTO history counts examples and KTO arms compare in
examples/s; a reward model's FLOPs count its scalar head; every TRL config kwarg is a name the installed
TRL accepts and resolves to the experiment's setting, GKD refuses what it cannot match; tiny runs of the
three TRL arms train align's own model on align's tokens."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest
import torch

from bench import pairs as bench_pairs
from bench import run as harness
from bench import trl_objectives as trl
from bench.common import TINY_DISTILL, add_ratios, compose_typed, experiment_config, model_flops, summarise
from bench.teacher import TEACHER_DIR, write_teacher
from tests.config.conftest import dry_run

# ------------------------------------------------------------------------------------ the harness


def test_each_arm_reads_what_the_harness_writes_for_it(out, capsys):
    cmds = dry_run(capsys, "--tiny", "kto_default", "trl_kto", "reward_model_default", "trl_reward",
                   "distill_default", "trl_gkd", "--steps", "3", "--warmup", "1", "--hf-steps", "3", "--hf-warmup", "1",
                   "--pairs", "24")
    for align, ref in (("kto_default", "trl_kto"), ("reward_model_default", "trl_reward")):
        assert f"experiment=bench/{align} data.path={out}/pairs.jsonl " in cmds[align]
        assert f"bench/trl_objectives.py --arm {ref} --steps 3 --warmup 1 --pairs-file {out}/pairs.jsonl" in cmds[ref]
    assert f"experiment=bench/distill_default objective.teacher={out}/{TEACHER_DIR} " in cmds["distill_default"]
    assert "data.path" not in cmds["distill_default"] and all(o in cmds["distill_default"] for o in TINY_DISTILL)
    assert f"--arm trl_gkd --steps 3 --warmup 1 --teacher {out}/{TEACHER_DIR} " in cmds["trl_gkd"]
    assert cmds["trl_gkd"].endswith("--tiny") and not out.exists()
    # align's tiny distillation and TRL's read one rollout: 16 prompts x 1 completion in 2 micro-batches
    a = harness.parse_args(["--tiny", "distill_default", "--warmup", "1"])
    mine = compose_typed(harness.plan_align(harness.resolve("distill_default"), a, out).overrides)
    theirs = trl.arm_config("trl_gkd", True, out / TEACHER_DIR)
    for typed in (mine, theirs):
        o = typed.objective
        assert (o.prompts_per_rollout, o.group_size, o.max_new_tokens, typed.trainer.grad_accum) == (16, 1, 16, 2)
        assert o.teacher == str(out / TEACHER_DIR)


@pytest.mark.parametrize("name, plain", [
    ("kto_default", ["objective=kto", "data=preference", "data.path=pairs.jsonl"]),
    ("reward_model_default", ["objective=reward_model", "data=preference", "data.path=pairs.jsonl"]),
    ("distill_default", ["objective=distill", "data=gsm8k_prompts"])])
def test_the_objective_default_arms_carry_no_performance_or_objective_override(name, plain):
    """Each arm is its objective's run as a user types it on the bench's model and data: the sampler,
    attention, parallel and compile switches, and every objective key but the distillation rollout's shape
    (grpo_default's 512 completions of 256 tokens) and its teacher, as the objective's composition gives them."""
    arm = experiment_config(f"bench/{name}")
    plain = compose_typed(["model=mistral", *plain])
    for group in ("sampler", "attention", "parallel"):
        assert getattr(arm, group) == getattr(plain, group), group
    assert (arm.trainer.compile, arm.optimizer.compile, arm.trainer.loss_chunk_tokens) == ("auto", "auto", "auto")
    shape = {"teacher": None, "prompts_per_rollout": plain.objective.prompts_per_rollout,
             "max_new_tokens": plain.objective.max_new_tokens} if name == "distill_default" else {}
    assert dataclasses.replace(arm.objective, **shape) == plain.objective
    if shape:
        o = arm.objective
        assert (o.prompts_per_rollout * o.group_size, o.max_new_tokens, arm.trainer.grad_accum) == (512, 256, 16)


def test_the_trl_arms_need_the_pairs_their_steps_read(out, capsys):
    with pytest.raises(SystemExit) as e:
        harness.main(["--dry-run", "trl_kto", "trl_reward", "--hf-steps", "20", "--hf-warmup", "5", "--pairs", "100"])
    err = capsys.readouterr().err
    # a KTO example is one side of a pair: 20 steps of 8 examples read 80 pairs, the reward model's 160
    assert e.value.code == 2 and "trl_kto reads 80, trl_reward reads 160" in err and "--pairs >= 160" in err
    assert harness.main(["--dry-run", "trl_kto", "--hf-steps", "20", "--hf-warmup", "5", "--pairs", "80"]) == 0
    assert harness.main(["--dry-run", "trl_gkd", "--hf-steps", "2", "--hf-warmup", "1", "--pairs", "1"]) == 0
    assert not out.exists()


def test_one_command_writes_one_teacher(out, capsys, monkeypatch):
    argv = ["--dry-run", "distill_default", "trl_gkd", "--steps", "3", "--warmup", "1", "--hf-steps", "2",
            "--hf-warmup", "1"]
    assert harness.main(argv) == 0  # one student: one teacher
    capsys.readouterr()
    # the TRL arm's student at another seed: the command cannot write a teacher for both
    monkeypatch.setattr(harness, "experiment_config",
                        lambda e, tiny: compose_typed([f"experiment={e}", "trainer.seed=7"]))
    with pytest.raises(SystemExit) as e:
        harness.main(argv)
    assert e.value.code == 2 and "distill_default, trl_gkd: their students differ" in capsys.readouterr().err
    assert not out.exists()


def test_the_teacher_is_the_students_model_at_another_init_and_align_accepts_it(tmp_path):
    from align.data.tokenizer import load_tokenizer
    from align.objectives.reference import weights_sha256
    from align.objectives.teacher import load_teacher, teacher_problem

    line = write_teacher(tmp_path, experiment_config("bench/distill_default", tiny=True))
    assert "seed 1" in line and (tmp_path / TEACHER_DIR / "config.json").is_file()
    typed = trl.arm_config("trl_gkd", True, tmp_path / TEACHER_DIR)
    assert teacher_problem(typed)[0] is None  # preflight's check: the student's tokenizer and vocabulary
    student = trl.build_student(typed, load_tokenizer(typed.model), torch.device("cpu"))
    teacher = load_teacher(typed)
    assert type(teacher) is type(student) and teacher.config.vocab_size == student.config.vocab_size
    assert weights_sha256(teacher) != weights_sha256(student)


def _write_kto_run(run_dir: Path, examples_per_step: int) -> None:
    run_dir.mkdir(parents=True)
    rows = [dict(elapsed_s=float(i), real_tokens=1000, tokens=1100, model_flops=1e12, step_time_s=1.0, loss=0.5,
                 mem_peak_gib=20.0, mem_alloc_retries=0, examples=examples_per_step) for i in range(1, 5)]
    (run_dir / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prov = {"model": {}, "objective": {"reference": {"resolved": "model"}}}
    (run_dir / "provenance.json").write_text(json.dumps(prov))


def test_a_kto_run_counts_examples_and_kto_arms_compare_in_examples_per_s(tmp_path):
    arm = harness.Arm("kto_x", "bench/kto_default", run_dir=tmp_path / "kto_x", data_file="pairs.jsonl")
    _write_kto_run(arm.run_dir, examples_per_step=24)
    m = harness.read_align_run(arm, warmup=1, useful_per_token=1.0)
    assert (m["examples"], m["reference"], m["seconds"]) == (72, "model", 3.0) and "pairs" not in m
    kto = summarise(m, None)
    assert kto["examples_per_s"] == 24.0 and kto["pairs_per_s"] is None
    ref = summarise(dict(arm="trl_kto", seconds=2.0, steps_measured=2, real_tokens=4000, tokens=5000,
                         counted_flops=None, useful_flops=0.0, peak_mem_gib=None, examples=16,
                         setting="TRL x, 8 examples per step"), None)
    results = [ref, kto]
    add_ratios(results, ["trl_kto"])
    assert kto["vs_trl_kto"] == pytest.approx(3.0)  # examples/s: 24 / 8 (real tokens/s would say 0.5)
    md = harness.table(results, None, ["trl_kto"])
    assert "| arm | examples/s | real tok/s |" in md and "| (2) kto_x | 24.0 | 1,000 |" in md
    assert "TRL x, 8 examples per step" in md and "reference=model" in md


def test_a_reward_models_flops_count_its_scalar_head_not_an_lm_head():
    rm = model_flops(experiment_config("bench/reward_model_default"))
    lm = model_flops(experiment_config("bench/kto_default"))  # the same backbone under the LM head
    h = lm.params_active - rm.params_active
    assert h == 32000 * 2048 - 2048  # the 32k x 2048 LM head out, a 2048 x 1 score in


# ------------------------------------------------------------------------------------- TRL's arms


@pytest.mark.parametrize("arm", sorted(trl.ARMS))
def test_trl_kwargs_are_names_the_installed_trl_accepts_and_the_experiments_settings(arm, tmp_path):
    from trl import KTOConfig, KTOTrainer, RewardConfig, RewardTrainer
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    from align.core.signatures import check_kwargs

    config_cls, trainer_cls, kwargs_of = {"trl_kto": (KTOConfig, KTOTrainer, trl.kto_config_kwargs),
                                          "trl_reward": (RewardConfig, RewardTrainer, trl.reward_config_kwargs),
                                          "trl_gkd": (GKDConfig, GKDTrainer, trl.gkd_config_kwargs)}[arm]
    typed = experiment_config(trl.ARMS[arm])
    for cuda in (True, False):
        check_kwargs(config_cls.__init__, kwargs_of(typed, str(tmp_path), 20, cuda), config_cls.__name__)
    cfg = config_cls(**kwargs_of(typed, str(tmp_path), 20, cuda=False))  # needs no GPU
    assert cfg.gradient_checkpointing is False and cfg.max_length == typed.data.max_seq_len == 1024
    assert (cfg.learning_rate, cfg.max_grad_norm, cfg.seed) == (typed.optimizer.lr, 1.0, typed.trainer.seed)
    o = typed.objective
    if arm == "trl_kto":
        assert (cfg.per_device_train_batch_size, cfg.loss_type, cfg.precompute_ref_log_probs) == (8, "kto", False)
        assert (cfg.beta, cfg.desirable_weight, cfg.undesirable_weight) == (o.beta, 1.0, 1.0)
        assert cfg.train_sampling_strategy == "sequential"
    elif arm == "trl_reward":
        assert cfg.per_device_train_batch_size == 8 and cfg.center_rewards_coefficient is None
    else:  # grpo_default's rollout: 512 completions of 256 tokens per step in 16 micro-batches of 32
        assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps) == (32, 16)
        assert (cfg.lmbda, cfg.seq_kd, cfg.beta, cfg.max_new_tokens, cfg.temperature) == (1.0, False, 1.0, 256, 1.0)
    names = {"trl_kto": ["ref_model", "data_collator"], "trl_reward": ["data_collator"], "trl_gkd": ["teacher_model"]}
    check_kwargs(trainer_cls.__init__, dict.fromkeys(["model", "args", "train_dataset", "processing_class", "callbacks",
                                                      *names[arm]]), trainer_cls.__name__)


def test_gkd_refuses_what_it_cannot_match_and_takes_aligns_divergence():
    from align.config.distill_config import DistillLoss

    typed = experiment_config("bench/distill_default")
    assert trl.gkd_mismatch(typed) is None and trl.gkd_beta(typed) == 1.0  # reverse KL: TRL's beta 1

    def with_objective(**kw):
        return dataclasses.replace(typed, objective=dataclasses.replace(typed.objective, **kw))

    assert trl.gkd_beta(with_objective(loss=DistillLoss.jsd, beta=0.3)) == 0.3
    assert "group_size=2" in trl.gkd_mismatch(with_objective(group_size=2))
    assert "objective.top_p=0.9" in trl.gkd_mismatch(with_objective(top_p=0.9))
    assert "objective.temperature=0.7" in trl.gkd_mismatch(with_objective(temperature=0.7))


def test_what_the_trl_settings_rely_on_still_holds_in_the_installed_trl():
    from trl import KTOConfig, RewardConfig
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    # TRL checkpoints activations unless told otherwise: the arms say False (align never recomputes)
    for cls in (KTOConfig, RewardConfig, GKDConfig):
        assert cls.__dataclass_fields__["gradient_checkpointing"].default is True, cls.__name__
    # KTO reads its examples in order (its KL completions are its batch's neighbours'): align's order is kept
    assert KTOConfig.__dataclass_fields__["train_sampling_strategy"].default == "sequential"
    # GKD samples at top_k 0 and top_p 1, scales no logits in its loss, and generates in every micro-batch
    init, loss = inspect.getsource(GKDTrainer.__init__), inspect.getsource(GKDTrainer.compute_loss)
    assert '"top_k": 0' in init and '"top_p": 1.0' in init and "temperature" not in loss
    assert "self.generate_on_policy_outputs(" in inspect.getsource(GKDTrainer.training_step)


# ------------------------------------------------------------------------------ tiny runs, in-process


@pytest.fixture(scope="module")
def short_pairs(tmp_path_factory) -> Path:
    """Bench pairs cut short (the code path, not the lengths, is under test)."""
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    bench_pairs.write_pairs(path, [{"prompt": p["prompt"][:80], "chosen": p["chosen"][:60],
                                    "rejected": p["rejected"][:60]} for p in bench_pairs.build_pairs(24)])
    return path


def test_tiny_trl_reward_trains_the_model_align_builds_on_aligns_tokens(short_pairs, tmp_path):
    from align.objectives.reference import weights_sha256
    from tests.conftest import build_trainer

    typed = experiment_config("bench/reward_model_default", tiny=True)
    m = trl.reward_arm("trl_reward", typed, short_pairs, steps=2, warmup=1)
    assert (m["steps_measured"], m["pairs"]) == (1, 8) and m["real_tokens"] > 0 and m["tokens_match_align"] is True
    assert m["head"] == "MistralForSequenceClassification" and m["trl"]["gradient_checkpointing"] is False
    # the policy is align's trainer's own, scalar head included: the same weights at the same seed
    base = compose_typed(["experiment=bench/reward_model_default"])
    aligns = build_trainer(tmp_path, "experiment=bench/reward_model_default", *harness.tiny_overrides(base),
                           f"data.path={short_pairs}", f"data.cache_dir={tmp_path / 'cache'}")
    assert m["weights_sha256"] == weights_sha256(aligns.model)


def test_tiny_trl_kto_reads_aligns_examples_in_aligns_order(short_pairs):
    typed = experiment_config("bench/kto_default", tiny=True)
    m = trl.kto_arm("trl_kto", typed, short_pairs, steps=2, warmup=1)
    # 2 steps of 8 examples: align's unpairing of the first 8 pairs, the 8 chosen sides then the 8 rejected
    assert (m["steps_measured"], m["examples"], m["desirable"]) == (1, 8, 8) and m["tokens_match_align"] is True
    assert m["trl"]["precompute_ref_log_probs"] is False and "a reference copy" in m["setting"]


def test_tiny_trl_gkd_samples_on_policy_against_the_teacher_the_bench_wrote(tmp_path):
    write_teacher(tmp_path, experiment_config("bench/distill_default", tiny=True))
    typed = trl.arm_config("trl_gkd", True, tmp_path / TEACHER_DIR)
    m = trl.gkd_arm("trl_gkd", typed, steps=2, warmup=1)
    assert (m["steps_measured"], m["samples"]) == (1, 16) and m["tokens_match_align"] is True
    assert 0 < m["completion_tokens"] <= 16 * 16 and m["prompt_tokens"] > 0
    assert 0 < m["generation_s"] < m["rollout_s"] < m["seconds"]  # the rollout phase: generate and the teacher
    assert m["teacher_weights_sha256"] != m["weights_sha256"] and m["trl"]["lmbda"] == 1.0
