"""The eval schema: every field documented, every option of conf/eval/ composes, values refused by key."""

from __future__ import annotations

import ast
import inspect

import pytest

import align.evaluation.config as mod
from align.errors import ConfigError
from align.evaluation.config import EvalConfig, EvalRunConfig, EvalTask, to_typed
from align.run.cli import CONF_DIR, compose


def test_every_field_has_a_docstring():
    tree = ast.parse(inspect.getsource(mod))
    missing = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Config"):
            for i, stmt in enumerate(node.body):
                if isinstance(stmt, ast.AnnAssign):
                    nxt = node.body[i + 1] if i + 1 < len(node.body) else None
                    if not (isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)):
                        missing.append(f"{node.name}.{stmt.target.id}")
    assert not missing


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF_DIR / "eval").glob("*.yaml")))
def test_every_eval_option_composes(option, tmp_path):
    extra = ["eval.oracle=true"] if option == "gsm8k" else [f"eval.prompts={tmp_path / 'p.jsonl'}", "model_dir=x"]
    typed = to_typed(compose([f"eval={option}", *extra], config_name="eval"))
    assert isinstance(typed, EvalRunConfig) and typed.eval.task == EvalTask(option)


def test_the_greedy_default_and_the_sampled_default():
    assert EvalConfig().resolved_temperature == 0 and EvalConfig(samples=8).resolved_temperature == 1.0
    assert EvalConfig(samples=8, temperature=0.6).resolved_temperature == 0.6


@pytest.mark.parametrize("kw,key", [
    (dict(samples=0), "eval.samples"),
    (dict(limit=0), "eval.limit"),
    (dict(samples=4, temperature=0.0), "eval.temperature"),
    (dict(top_p=0.9), "eval.top_p"),                       # greedy takes no top_p
    (dict(template="no placeholder"), "eval.template"),
    (dict(oracle_shuffle=True), "eval.oracle_shuffle"),
    (dict(task=EvalTask.refusal), "eval.prompts"),
    (dict(task=EvalTask.refusal, prompts="p.jsonl", oracle=True), "eval.oracle"),
    (dict(oracle=True, compare_to="x"), "eval.compare_to"),
])
def test_values_refused_by_key(kw, key):
    with pytest.raises(ConfigError) as e:
        EvalConfig(**kw)
    assert str(e.value).startswith(key + ":")


def test_the_root_needs_a_model_unless_oracle():
    with pytest.raises(ConfigError, match="^model_dir: is required"):
        EvalRunConfig()
    assert EvalRunConfig(eval=EvalConfig(oracle=True)).model_dir is None
    with pytest.raises(ConfigError, match="^dtype:"):
        EvalRunConfig(model_dir="x", dtype="int8")


@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow"])
def test_a_tracker_eval_does_not_log_to_is_refused(tracker):
    with pytest.raises(ConfigError, match=f"^logger: align.eval logs its summary and report to W&B only: "
                                          f"logger=wandb or logger=none \\(got '{tracker}'\\)$"):
        to_typed(compose([f"logger={tracker}", "eval.oracle=true"], config_name="eval"))

