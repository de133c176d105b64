"""Every option of every config group composes and converts to the typed config."""

from __future__ import annotations

import pytest

from align.config import GROUP_SCHEMAS, TrainConfig, to_typed
from align.run.cli import CONF_DIR

# eval/ belongs to conf/eval.yaml (align.eval), not to the train config: tests/unit/evaluation/test_config.py
GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "eval"))
OPTIONS = [
    (g, f.relative_to(CONF_DIR / g).with_suffix("").as_posix())
    for g in GROUPS
    for f in sorted((CONF_DIR / g).rglob("*.yaml"))
]


def test_the_walk_found_every_group_the_design_names():
    assert {"model", "data", "sampler", "attention", "optimizer", "parallel", "logger", "experiment"} <= set(GROUPS)
    assert len(OPTIONS) >= 18


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_converts(group, option, compose, tmp_path):
    extra = []
    if (group, option) in (("data", "jsonl"), ("data", "parquet"), ("data", "tokens"), ("data", "preference")):
        f = tmp_path / f"d.{option}"
        f.write_text('{"prompt": "hi", "response": "there"}\n')
        extra = [f"data.path={f}"]
    if (group, option) in (("data", "gsm8k_pairs"), ("data", "preference")):
        extra.append("objective=dpo")
    if (group, option) == ("objective", "dpo"):
        extra = []
    if (group, option) == ("data", "jsonl_prompts"):
        f = tmp_path / "p.jsonl"
        f.write_text('{"prompt": "1+1=", "reference": "2"}\n')
        extra = [f"data.path={f}"]
    if group == "reward" and option != "none":
        extra = ["objective=grpo"]  # only objective=grpo reads a reward
    if (group, option) == ("reward", "python"):
        extra.append("reward.function=tests.python_rewards:recorded")
    if (group, option) == ("reward", "model"):
        extra.append(f"reward.path={tmp_path}")  # read in preflight, not when the config converts
    if (group, option) == ("model", "hf"):
        extra = [f"model.pretrained={tmp_path}"]  # model=hf has no presets: a checkpoint dir is required
    cfg = compose([f"{group}={option}", *extra], config_name="probe" if group == "probe" else "train")
    typed = to_typed(cfg)
    assert isinstance(typed, TrainConfig)
    if group in GROUP_SCHEMAS:
        assert isinstance(getattr(typed, group), GROUP_SCHEMAS[group])


def test_every_schema_field_has_a_docstring():
    import ast

    from align.tools.docs import schema_tree

    tree = schema_tree()
    assert sum(isinstance(n, ast.ClassDef) and n.name.endswith("Config") for n in tree.body) >= 15
    missing = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Config"):
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign) and node.name != "TrainConfig":
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    if not (
                        isinstance(nxt, ast.Expr)
                        and isinstance(nxt.value, ast.Constant)
                        and isinstance(nxt.value.value, str)
                    ):
                        missing.append(f"{node.name}.{stmt.target.id}")
    assert not missing, f"fields without a docstring: {missing}"


def test_key_names_the_team_relies_on(compose):
    typed = to_typed(
        compose(
            [
                "trainer.max_steps=7",
                "data.max_seq_len=256",
                "sampler=bucket",
                "sampler.bucket_size=32",
                "model.preset=tiny",
                "model.pretrained=null",
            ]
        )
    )
    assert (typed.trainer.max_steps, typed.data.max_seq_len, typed.sampler.bucket_size) == (7, 256, 32)
    assert typed.model.preset.value == "tiny" and typed.model.pretrained is None
