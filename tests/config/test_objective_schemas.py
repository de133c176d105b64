"""One schema per objective (align/config/objective.py): each conf/objective option composes its own class,
a key another objective reads is an unknown key of the composed one (one line naming the key, the keys
it accepts and the objective that reads it), and a run's replayable config names the class again."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from align.config import OBJECTIVE_SCHEMAS, ObjectiveConfig, TrainConfig, accepted_kinds, schema_fields, to_typed
from align.run import cli
from align.run.hydra_files import write_replay_config


def _refused(capsys, *argv: str) -> str:
    """The one stderr line of a refused command line (exit 2)."""
    with pytest.raises(SystemExit) as e:
        cli.validate_command_line(list(argv))
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(err) == 1, (e.value.code, err)
    return err[0].removeprefix("align: error: ")


@pytest.mark.parametrize("kind", list(OBJECTIVE_SCHEMAS))
def test_each_option_composes_its_own_class(compose, kind):
    typed = to_typed(compose([f"objective={kind}"]))
    assert type(typed.objective) is OBJECTIVE_SCHEMAS[kind] and typed.objective.kind == kind


def test_no_key_is_declared_by_an_objective_that_does_not_read_it():
    """The keys every objective reads sit on the shared base; the rest on exactly the classes that read them."""
    assert list(schema_fields(ObjectiveConfig)) == ["kind"]
    assert set(schema_fields(OBJECTIVE_SCHEMAS["sft"])) == {"kind"}
    dpo, grpo = (set(schema_fields(OBJECTIVE_SCHEMAS[k])) for k in ("dpo", "grpo"))
    assert dpo & grpo == {"kind", "reference", "reference_dtype"}
    assert {"loss", "beta", "gate_tolerance"} <= dpo and {"group_size", "kl_coef", "generation_dtype"} <= grpo


@pytest.mark.parametrize("kind", list(OBJECTIVE_SCHEMAS))
def test_a_key_of_another_objective_is_an_unknown_key_of_the_composed_one(capsys, kind):
    mine = list(schema_fields(OBJECTIVE_SCHEMAS[kind]))
    foreign = sorted({k for c in OBJECTIVE_SCHEMAS.values() for k in schema_fields(c)} - set(mine))
    assert foreign
    for i, name in enumerate(foreign):
        readers = ", ".join(f"objective={k}" for k, c in OBJECTIVE_SCHEMAS.items() if name in schema_fields(c))
        want = (f"objective.{name}: unknown key in objective={kind} (a key of {readers}); "
                f"accepted keys: {', '.join(mine)}")
        # Hydra refuses it against the schema; `+` adds it to the typed node and align's walk refuses it
        for plus in ("", "+") if i == 0 else ("",):
            assert _refused(capsys, f"objective={kind}", f"{plus}objective.{name}=1") == want


def test_a_typo_under_an_objective_names_the_closest_key_of_its_schema(capsys):
    line = _refused(capsys, "objective=dpo", "objective.betta=0.2")
    assert line.startswith("objective.betta: unknown key in objective=dpo (did you mean objective.beta?); "
                           "accepted keys: kind, loss, beta,"), line


def test_kind_is_the_options_and_is_not_switched_by_a_key(capsys):
    line = _refused(capsys, "objective.kind=dpo")
    assert line == ("objective.kind: objective=sft is kind sft: choose the objective as an option, objective=dpo "
                    f"(accepted: {accepted_kinds()}) (got 'dpo')"), line


def test_an_objective_option_of_the_users_that_names_no_schema(tmp_path, capsys):
    """Only `kind`: the class its kind names, with its defaults; any other key: refused, naming the remedy."""
    (tmp_path / "objective").mkdir()
    (tmp_path / "objective" / "mine.yaml").write_text("kind: grpo\n")
    [typed] = cli.validate_command_line(["--config-dir", str(tmp_path), "objective=mine", "reward=exact_int",
                                         "sampler=shuffle", "data=add"])
    assert type(typed.objective) is OBJECTIVE_SCHEMAS["grpo"] and typed.objective.group_size == 16
    (tmp_path / "objective" / "mine.yaml").write_text("kind: dpo\nbeta: 0.2\n")
    line = _refused(capsys, "--config-dir", str(tmp_path), "objective=mine", "data=gsm8k_pairs")
    assert line == ("In 'objective/mine': objective.beta: unknown key in objective (this objective option "
                    "composes no schema: its defaults list names one first, e.g. - /schema/objective/sft@_here_); "
                    "accepted keys: kind"), line


def test_a_config_built_without_an_option_holds_the_class_its_kind_names():
    assert type(TrainConfig().objective) is OBJECTIVE_SCHEMAS["sft"]
    merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), {"objective": {"kind": "dpo"},
                                                                  "data": {"source": "gsm8k_pairs"}})
    typed = OmegaConf.to_object(merged)
    assert type(typed.objective) is OBJECTIVE_SCHEMAS["dpo"] and typed.objective.beta == 0.1


@pytest.mark.parametrize("kind", list(OBJECTIVE_SCHEMAS))
def test_the_replayable_config_names_the_objectives_class_again(compose, tmp_path, kind):
    overrides = {"dpo": ["objective.beta=0.3"], "grpo": ["objective.group_size=4"]}
    composed = compose([f"objective={kind}", *overrides.get(kind, [])])
    write_replay_config(tmp_path / "config.yaml", OmegaConf.to_container(composed, resolve=False))
    again = to_typed(cli.compose([], config_name="config", config_dir=tmp_path))
    assert dataclasses.asdict(again.objective) == dataclasses.asdict(to_typed(composed).objective)
    assert type(again.objective) is OBJECTIVE_SCHEMAS[kind]
