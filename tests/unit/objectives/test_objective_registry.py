"""Adding an objective is its module, its schema, its conf/objective/<kind>.yaml and its tests: each
registers itself (align/config/objective.py `OBJECTIVE_SCHEMAS`, align/objectives/__init__.py `register`)
and discovery imports every module of the two packages, so no table lists the objectives."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
from hydra.core.config_store import ConfigStore

import align.config
import align.objectives
from align.config import OBJECTIVE_SCHEMAS, accepted_kinds
from align.objectives import _REGISTERED, build_objective, objective_class, objective_classes
from align.run import cli

ALIGN = Path(align.__file__).resolve().parent

TOY_SCHEMA = '''
from dataclasses import dataclass

from align.config.objective import ObjectiveConfig


@dataclass
class ToyConfig(ObjectiveConfig):
    """objective=toy: a throwaway objective of the test."""

    kind: str = "toy"
    """toy: the test's."""
    sequences: int = 3
    """Sequences per sampler row."""
'''

TOY_OBJECTIVE = '''
from align.objectives import register
from align.objectives.plan_terms import PlanTerms


class ToyTerms(PlanTerms):
    def tokens_per_micro_batch(self, cfg, prompt_tokens):
        return cfg.sampler.micro_batch_size * cfg.objective.sequences * cfg.data.max_seq_len


@register
class Toy:
    name = "toy"
    terms = ToyTerms

    def __init__(self, cfg):
        self.sequences = cfg.objective.sequences
'''

TOY_OPTION = """defaults:
  - /schema/objective/toy@_here_

kind: toy
sequences: 5
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A toy objective's three files in their own folders, found as modules of align.config and
    align.objectives; every registration undone afterwards."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "toy_config.py").write_text(TOY_SCHEMA)
    (tmp_path / "objectives").mkdir()
    (tmp_path / "objectives" / "toy.py").write_text(TOY_OBJECTIVE)
    (tmp_path / "conf" / "objective").mkdir(parents=True)
    (tmp_path / "conf" / "objective" / "toy.yaml").write_text(TOY_OPTION)
    schemas, classes = dict(OBJECTIVE_SCHEMAS), dict(objective_classes())  # before the toy's folders are seen
    monkeypatch.setattr(align.config, "__path__", [*align.config.__path__, str(tmp_path / "config")])
    monkeypatch.setattr(align.objectives, "__path__", [*align.objectives.__path__, str(tmp_path / "objectives")])
    objective_classes.cache_clear()
    yield tmp_path / "conf"
    for registry, before in ((OBJECTIVE_SCHEMAS, schemas), (_REGISTERED, classes)):
        registry.clear()
        registry.update(before)
    objective_classes.cache_clear()
    ConfigStore.instance().repo["schema"]["objective"].pop("toy.yaml", None)
    for name in ("align.config.toy_config", "align.objectives.toy"):
        sys.modules.pop(name, None)


def test_a_new_objective_composes_plans_and_builds_from_its_own_files_alone(toy, capsys):
    from align.plan.memory import tokens_per_micro_batch
    from align.plan.planner import plan

    align.config.discover()  # what `import align.config` does
    align.config.register()
    [typed] = cli.validate_command_line(["--config-dir", str(toy), "objective=toy"])
    assert type(typed.objective).__name__ == "ToyConfig" and typed.objective.sequences == 5
    assert objective_class(typed).__name__ == "Toy"
    job = plan(typed, torch.device("cpu"))
    assert tokens_per_micro_batch(job.cfg) == job.cfg.sampler.micro_batch_size * 5 * job.cfg.data.max_seq_len
    assert build_objective(job.cfg).sequences == 5
    with pytest.raises(SystemExit):  # a kind nothing registers: one line, the registered kinds listed
        cli.validate_command_line(["--config-dir", str(toy), "objective=toy", "objective.kind=nope"])
    assert accepted_kinds().endswith(", toy")
    assert capsys.readouterr().err.strip().endswith(f"(accepted: {accepted_kinds()}) (got 'nope')")


def test_an_unregistered_kind_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.validate_command_line(["objective.kind=nope"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and err == ["align: error: objective.kind: no objective is registered under this kind "
                                         f"(accepted: {accepted_kinds()}) (got 'nope')"], err


def _names(kinds: dict[str, list[type]]) -> dict[str, str]:
    """Each way code names an objective -> its kind: the kind itself, and its classes' names."""
    out = {k: k for k in kinds}
    out.update({c.__name__: k for k, classes in kinds.items() for c in classes})
    return out


def tables(root: Path, names: dict[str, str]) -> list[str]:
    """`file:line` of each literal (dict, set, list, tuple) or enum that names two objectives or more: a table
    a new objective would have to be added to."""

    def kind(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return names.get(node.value)
        if isinstance(node, ast.Name):
            return names.get(node.id)
        if isinstance(node, ast.Attribute):
            return names.get(node.attr)
        return None

    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                elts = [*node.keys, *node.values]
            elif isinstance(node, (ast.Set, ast.List, ast.Tuple)):
                elts = node.elts
            elif isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(b) for b in node.bases):
                elts = [t for s in node.body if isinstance(s, ast.Assign) for t in s.targets]
            else:
                continue
            if len({k for e in elts if e is not None and (k := kind(e))}) > 1:
                out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def _registered_names() -> dict[str, str]:
    kinds = {k: [c, objective_classes()[k], objective_classes()[k].terms] for k, c in OBJECTIVE_SCHEMAS.items()}
    return _names(kinds)


def test_no_module_holds_a_table_of_the_objectives():
    assert tables(ALIGN, _registered_names()) == []


def test_the_table_search_finds_the_tables_registration_replaced(tmp_path):
    (tmp_path / "objective.py").write_text("class ObjectiveKind(StrEnum):\n    sft = 'sft'\n    dpo = 'dpo'\n")
    (tmp_path / "classes.py").write_text("x = 1\nT = {ObjectiveKind.sft: SFT, ObjectiveKind.grpo: GRPO}[k]\n")
    (tmp_path / "terms.py").write_text("TERMS = {'sft': SFTTerms, 'dpo': DPOTerms}\nONE = {'sft': 1}\n")
    assert tables(tmp_path, _registered_names()) == ["classes.py:2", "objective.py:1", "terms.py:1"]
