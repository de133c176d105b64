"""A python reward (`reward.function`): loaded and checked once, called by keyword as TRL calls a reward
function, and every way it can go wrong one line (exit 2) that names the key or the prompt."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from align.errors import EXIT_CONFIG, ConfigError
from align.rewards import WeightedReward
from align.rewards.function import Group, load_function
from tests import python_rewards
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "rewards.py"


def group(n: int = 3, **columns) -> Group:
    return Group(prompt="<user>1+2=<assistant>", reference="3", columns=columns, where="data/p.jsonl:7",
                 completions=[f"{i} + 3" for i in range(n)], completion_ids=[[i, 5] for i in range(n)])


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and e.value.exit_code == EXIT_CONFIG, msg
    return msg


def test_the_documented_example_loads_from_its_file_and_records_its_hash():
    f = load_function(f"{EXAMPLE}:concise_answer")
    assert f.identity() == {"function": f"{EXAMPLE}:concise_answer", "file": str(EXAMPLE),
                            "sha256": hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()}
    g = Group(prompt="p", reference="3", columns={"question": "1+2=", "answer": "3"}, where="x:1",
              completions=["3", "the sum is 3", "4"], completion_ids=[[1], [2], [3]])
    assert f(g) == [1.0, 1.0 - 3 * 0.1, 0.0]


def test_a_module_path_is_imported_and_called_by_keyword_with_the_records_fields():
    f = load_function("tests.python_rewards:recorded")
    assert f.file == REPO / "tests" / "python_rewards.py"
    python_rewards.CALLS.clear()
    out = f(group(3, question="1+2=", answer="3"))
    call = python_rewards.CALLS[-1]
    assert out == [float(len(c) % 3) for c in call["completions"]]
    assert call == {"prompts": ["<user>1+2=<assistant>"] * 3, "completions": ["0 + 3", "1 + 3", "2 + 3"],
                    "completion_ids": [[0, 5], [1, 5], [2, 5]], "question": ["1+2="] * 3, "answer": ["3"] * 3}


@pytest.mark.parametrize("name, says", [
    ("raises", "raised ValueError: no score for this one"),
    ("one_short", "returned 2 value(s) for the prompt's 3 completions; accepted: one number per completion"),
    ("not_finite", "returned nan for completion 0; accepted: a finite number"),
    ("not_a_number", "returned a str for completion 0; accepted: a finite number"),
    ("none_value", "returned None for completion 0; accepted: a finite number"),
    ("not_a_list", "returned a float; accepted: a list of one number per completion"),
])
def test_a_bad_call_is_one_line_naming_the_prompt(name, says):
    f = load_function(f"tests.python_rewards:{name}")
    with pytest.raises(ConfigError) as e:
        f(group())
    assert one_line(e) == f"data/p.jsonl:7: reward.function tests.python_rewards:{name} {says}"


@pytest.mark.parametrize("spec, says", [
    ("tests.no_such_module:fn", "cannot import tests.no_such_module: No module named 'tests.no_such_module'"),
    ("tests.python_rewards:missing", "tests.python_rewards has no attribute 'missing'"),
    ("tests.python_rewards:NOT_CALLABLE", "names a int, not a function"),
    ("tests.python_rewards:no_kwargs", "has signature (prompts, completions); accepted: TRL's reward-function "
                                       "signature fn(prompts, completions, **kwargs), called by keyword"),
    ("tests.python_rewards:positional_only", "'prompts' parameter is positional only"),
    ("tests.python_rewards:asynchronous", "is an async function"),
    ("/no/such/reward.py:fn", "no such file: /no/such/reward.py"),
    ("tests.python_rewards", "must name a function as pkg.module:fn, or /path/to/file.py:fn"),
])
def test_a_function_that_cannot_be_used_is_one_line_naming_the_key(spec, says):
    with pytest.raises(ConfigError) as e:
        load_function(spec)
    msg = one_line(e)
    assert msg.startswith("reward.function: ") and says in msg and msg.endswith(f"(got {spec!r})"), msg


def test_a_file_that_raises_on_import_is_one_line(tmp_path):
    bad = tmp_path / "bad_reward.py"
    bad.write_text("import no_such_dependency_anywhere\n\ndef fn(prompts, completions, **kw):\n    return []\n")
    with pytest.raises(ConfigError) as e:
        load_function(f"{bad}:fn")
    assert f"loading {bad} raised ModuleNotFoundError: No module named 'no_such_dependency_anywhere'" in one_line(e)


def test_the_function_is_weighted_beside_the_verifiers():
    r = WeightedReward({"python": 0.5, "exact_int": 1.0}, function="tests.python_rewards:recorded")
    g = group(3)
    got = r.score_group(g)
    fn = [float(len(c) % 3) for c in g.completions]
    assert [x.total for x in got] == [0.5 * v + 1.0 for v in fn]  # every completion ends on 3 = the reference
    assert [x.parts["python"].value for x in got] == fn and all(x.parts["exact_int"].value == 1.0 for x in got)
    assert r.identity()["functions"]["python"]["function"] == "tests.python_rewards:recorded"
    assert "functions" not in WeightedReward({"exact_int": 1.0}).identity()  # verifier runs keep their identity


def test_python_in_weights_without_a_function_and_a_function_without_python_are_refused():
    with pytest.raises(ConfigError, match=r"^reward.function: reward.weights weighs python: name your function"):
        WeightedReward({"python": 1.0})
    with pytest.raises(ConfigError, match=r"^reward.function: is read only when reward.weights weighs python"):
        WeightedReward({"exact_int": 1.0}, function="tests.python_rewards:recorded")


def test_several_functions_are_weighted_by_their_names_beside_a_verifier_each_with_its_own_hash():
    import examples.rewards as example

    other = REPO / "tests" / "python_rewards.py"
    r = WeightedReward({"answer": 1.0, "parity": 0.25, "exact_int": 0.5},
                       functions={"answer": f"{EXAMPLE}:concise_answer", "parity": "tests.python_rewards:recorded"})
    g = group(3, question="1+2=", answer="3")
    g.completions[1] = "it is 4"
    got = r.score_group(g)
    answer = example.concise_answer(prompts=[g.prompt] * 3, completions=g.completions, answer=["3"] * 3)
    parity = [float(len(c) % 3) for c in g.completions]
    exact = [float(c.endswith("3")) for c in g.completions]
    assert len(set(answer)) > 1 and len(set(parity)) > 1 and exact == [1.0, 0.0, 1.0]
    assert [x.total for x in got] == [a + 0.25 * p + 0.5 * e for a, p, e in zip(answer, parity, exact)]
    assert [{n: s.value for n, s in x.parts.items()} for x in got] == [
        {"exact_int": e, "answer": a, "parity": p} for a, p, e in zip(answer, parity, exact)]
    assert r.identity()["functions"] == r.function_identities() == {
        "answer": {"function": f"{EXAMPLE}:concise_answer", "file": str(EXAMPLE),
                   "sha256": hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()},
        "parity": {"function": "tests.python_rewards:recorded", "file": str(other),
                   "sha256": hashlib.sha256(other.read_bytes()).hexdigest()}}
    # the shorthand stands beside them, weighted as python
    both = WeightedReward({"python": 2.0, "parity": 1.0}, function=f"{EXAMPLE}:concise_answer",
                          functions={"parity": "tests.python_rewards:recorded"})
    assert [x.total for x in both.score_group(g)] == [2.0 * a + p for a, p in zip(answer, parity)]


def test_a_failing_function_among_several_is_named_by_its_key():
    load_function("tests.python_rewards:not_finite")  # imported once under reward.function: the name still follows
    r = WeightedReward({"fine": 1.0, "bad": 1.0},
                       functions={"fine": "tests.python_rewards:recorded", "bad": "tests.python_rewards:not_finite"})
    with pytest.raises(ConfigError) as e:
        r.score_group(group())
    assert one_line(e) == ("data/p.jsonl:7: reward.functions.bad tests.python_rewards:not_finite returned nan for "
                           "completion 0; accepted: a finite number")


FN = "tests.python_rewards:recorded"
ALL = "exact_int, format, gsm8k, math"


@pytest.mark.parametrize("overrides, says", [
    (["+reward.weights.length=0.2"], f"reward.weights.length: unknown verifier or function; accepted: {ALL}, a name "
                                     "of reward.functions, python with reward.function, or model with reward.path "
                                     "(got 'length')"),
    ([f"+reward.functions.length={FN}", "+reward.weights.length=0.2", "+reward.weights.lenght=0.2"],
     f"reward.weights.lenght: unknown verifier or function; accepted: {ALL}, a function's name (length), or model "
     "with reward.path"),
    ([f"+reward.functions.length={FN}"], f"reward.functions.length: has no weight: set reward.weights.length (0 keeps "
                                         f"its part in the record without moving the reward) (got '{FN}')"),
    ([f"+reward.functions.format={FN}", "+reward.weights.format=1"],
     "reward.functions.format: clashes with the verifier format: reward.weights.format would weigh both"),
    ([f"+reward.functions.python={FN}", "+reward.weights.python=1"],
     "reward.functions.python: python is the name of reward.function (the one-function shorthand)"),
    ([f"+reward.functions.mean={FN}", "+reward.weights.mean=1"],
     "reward.functions.mean: a function's name must be an identifier other than the step row's own reward/"),
    (["+reward.functions.length=tests.python_rewards", "+reward.weights.length=1"],
     "reward.functions.length: must name a function as pkg.module:fn, or /path/to/file.py:fn"),
    # a function weighted 0 beside verifiers weighted 0: every completion scores the same
    (["reward.weights.exact_int=0", f"+reward.functions.length={FN}", "+reward.weights.length=0"],
     "reward.weights: every completion scores 0 whatever it says"),
])
def test_a_bad_functions_config_is_one_line_naming_the_key_when_composed(compose, overrides, says):
    from align.config import to_typed

    with pytest.raises(ConfigError) as e:
        to_typed(compose(["objective=grpo", *overrides]))
    assert one_line(e).startswith(says), str(e.value)


def test_a_function_weighted_other_than_0_beside_verifiers_weighted_0_composes(compose):
    from align.config import to_typed

    cfg = to_typed(compose(["objective=grpo", "reward.weights.exact_int=0", f"+reward.functions.length={FN}",
                            "+reward.weights.length=0.2"]))
    assert cfg.reward.functions == {"length": FN} and cfg.reward.weights == {"exact_int": 0.0, "length": 0.2}


def test_a_name_that_is_not_an_identifier_is_refused():
    with pytest.raises(ConfigError) as e:
        WeightedReward({"my length": 1.0}, functions={"my length": FN})
    assert one_line(e).startswith("reward.functions.my length: a function's name must be an identifier")


def test_preflight_imports_each_function_and_names_the_key_of_one_that_cannot_be_imported(compose):
    from align.config import to_typed
    from align.run.preflight_checks import check_reward

    cfg = to_typed(compose(["objective=grpo", f"+reward.functions.answer={EXAMPLE}:concise_answer",
                            "+reward.weights.answer=1", "+reward.functions.judge=tests.no_such_module:judge",
                            "+reward.weights.judge=0.5"]))
    checks = list(check_reward(cfg, None))
    assert [(c.name, c.status.value) for c in checks] == [("reward function answer", "PASS"),
                                                          ("reward function judge", "FAIL")]
    e = checks[-1].error()
    assert str(e).startswith("reward.functions.judge: cannot import tests.no_such_module: No module named") and \
        str(e).endswith("(got 'tests.no_such_module:judge')") and "\n" not in str(e) and e.exit_code == EXIT_CONFIG


def test_row_statistics_are_the_reward_keys_the_step_row_writes_itself():
    """A function named as one of these would overwrite the row's own statistic with its part."""
    from align.objectives.grpo_metrics import rollout_row
    from align.rewards.function import ROW_STATISTICS

    sums = {f"ro_{k}": 1.0 for k in ("seqs", "groups", "reward", "reward_sq", "zero_var", "zero_var_first", "abs_adv",
                                      "tokens", "stopped", "generated")}
    row = rollout_row(sums)
    assert {k.removeprefix("reward/") for k in row if k.startswith("reward/")} == set(ROW_STATISTICS)


class Completion:
    def __init__(self, prompt_index: int, ids: list[int]) -> None:
        self.prompt_index, self.token_ids = prompt_index, ids


class Prompts:
    def group(self, i, completions, completion_ids):
        return Group(prompt=f"p{i}", reference="3", columns={}, where=f"f.jsonl:{i + 1}", completions=completions,
                     completion_ids=completion_ids)


def test_a_rollout_is_scored_one_prompt_at_a_time_and_every_rank_stops_when_one_fails():
    from align.objectives.rollout_rewards import score_rollout

    comps = [Completion(0, [1]), Completion(0, [2, 2]), Completion(1, [3, 3, 3]), Completion(1, [4])]
    decode = lambda ids: "x" * len(ids)  # noqa: E731
    r = WeightedReward({"python": 1.0}, function="tests.python_rewards:recorded")
    python_rewards.CALLS.clear()
    totals, parts = score_rollout(r, Prompts(), np.array([4, 9]), comps, decode, lambda failed: failed)
    assert [c["prompts"] for c in python_rewards.CALLS] == [["p4", "p4"], ["p9", "p9"]]
    assert totals.tolist() == [1.0, 2.0, 0.0, 1.0] and parts == {"python": 4.0}
    # this rank's prompts scored fine, another rank's function failed: this rank stops too, not at a collective
    with pytest.raises(ConfigError, match="^reward.function: another rank's reward function failed"):
        score_rollout(r, Prompts(), np.array([4, 9]), comps, decode, lambda failed: True)
    bad = WeightedReward({"python": 1.0}, function="tests.python_rewards:not_finite")
    with pytest.raises(ConfigError, match=r"^f.jsonl:5: reward.function tests.python_rewards:not_finite returned nan"):
        score_rollout(bad, Prompts(), np.array([4, 9]), comps, decode, lambda failed: failed)
    assert math.isfinite(totals.sum())


def test_docs_rewards_md_shows_the_example_as_the_file_holds_it():
    import inspect

    import examples.rewards

    assert inspect.getsource(examples.rewards.concise_answer) in (REPO / "docs" / "rewards.md").read_text()
