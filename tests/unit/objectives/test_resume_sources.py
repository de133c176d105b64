"""A GRPO checkpoint records the source hash of each reward function and each tool its rollouts ran; a resume
whose code differs is refused with the key that names it, and a checkpoint that records none is refused where
this run has some (it cannot vouch for them). Built trainers, no step: the check reads the objective's state."""

from __future__ import annotations

import pytest

from align.errors import ConfigError
from tests.conftest import REPO, build_trainer

EXAMPLE = REPO / "examples" / "rewards.py"
BASE = ["objective=grpo", "objective.group_size=2", "objective.prompts_per_rollout=2", "trainer.device=cpu",
        "trainer.export=false", "trainer.max_steps=1"]
CALC = "align.rewards.calculator:calculator"


@pytest.fixture(scope="module")
def with_functions(tmp_path_factory):
    return build_trainer(tmp_path_factory.mktemp("functions"), *BASE, "reward=python",
                         f"reward.function={EXAMPLE}:brevity", f"+reward.functions.answer={EXAMPLE}:concise_answer",
                         "+reward.weights.answer=1.0").objective


@pytest.fixture(scope="module")
def with_tools(tmp_path_factory):
    return build_trainer(tmp_path_factory.mktemp("tools"), *BASE, "objective.max_turns=2", f"objective.tools=[{CALC}]",
                         "objective.max_new_tokens=32", "data.max_seq_len=256").objective


def test_the_state_records_each_functions_and_tools_source_hash(with_functions, with_tools):
    import hashlib

    state = with_functions.state_dict()
    want = hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert state["reward_functions_sha256"] == {"python": want, "answer": want} and state["tools_sha256"] == {}
    calc = REPO / "align" / "rewards" / "calculator.py"
    assert with_tools.state_dict()["tools_sha256"] == {"calculator": hashlib.sha256(calc.read_bytes()).hexdigest()}
    with_functions.load_state_dict(state)  # its own state resumes
    with_tools.load_state_dict(with_tools.state_dict())


@pytest.mark.parametrize("name,key", [("python", "reward.function"), ("answer", "reward.functions.answer")])
def test_a_resume_with_a_changed_reward_function_is_refused_naming_it(with_functions, name, key):
    state = with_functions.state_dict()
    state["reward_functions_sha256"] = {**state["reward_functions_sha256"], name: "0" * 64}
    with pytest.raises(ConfigError, match=rf"^{key}: the checkpoint's rollouts used reward function '{name}'"):
        with_functions.load_state_dict(state)


def test_a_resume_with_a_changed_tool_is_refused_naming_the_tools(with_tools):
    state = with_tools.state_dict()
    state["tools_sha256"] = {"calculator": "0" * 64}
    with pytest.raises(ConfigError, match=r"^objective.tools: the checkpoint's rollouts used tool 'calculator'"):
        with_tools.load_state_dict(state)


def test_a_checkpoint_recording_no_hashes_is_refused_only_where_the_run_has_functions_or_tools(with_functions,
                                                                                               with_tools):
    for objective, key in ((with_functions, "reward_functions_sha256"), (with_tools, "tools_sha256")):
        state = objective.state_dict()
        del state[key]
        with pytest.raises(ConfigError, match="records no .* source hashes"):
            objective.load_state_dict(state)
    state = with_tools.state_dict()
    del state["reward_functions_sha256"]  # the run has no functions: nothing to vouch for
    with_tools.load_state_dict(state)
