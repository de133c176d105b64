"""The bundled calculator tool (arithmetic by walking the ast, nothing else) and the tool-call parser: a
good call runs its tool; a malformed call, an unknown tool, bad arguments or a tool that raises come back
to the model as an `error:` result; a spec that names no tool is refused naming its key."""

from __future__ import annotations

import json

import pytest

from align.errors import ConfigError
from align.rewards.calculator import CalculatorError, calculator, evaluate
from align.rewards.tool_calls import CLOSE, MAX_RESULT_CHARS, OPEN, ToolBox, load_tool, parse_call, tool_names

CALC = "align.rewards.calculator:calculator"


def _call(name: str, **arguments) -> str:
    return f"let me compute {OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE} then answer"


@pytest.mark.parametrize("expr,want", [("12*34", "408"), ("2 + 3 * (4 - 1)", "11"), ("7 / 2", "3.5"), ("8/2", "4"),
                                       ("-3 ** 2", "-9"), ("17 // 5 + 17 % 5", "5"), ("2 ** 10", "1024"),
                                       ("0.1 + 0.2", str(0.1 + 0.2))])
def test_the_calculator_evaluates_arithmetic(expr, want):
    assert calculator(expr) == want


@pytest.mark.parametrize("expr,why", [
    ("__import__('os').system('true')", "not arithmetic"), ("x + 1", "not arithmetic"), ("'a' * 3", "not arithmetic"),
    ("(1).real", "not arithmetic"), ("1 < 2", "not arithmetic"), ("1 +", "cannot parse"), ("1 / 0", "division by zero"),
    ("9 ** 9 ** 9", "exponent"), ("10 ** 60 * 10", "digits"), ("1" * 300, "longer than"),
])
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expr, why):
    with pytest.raises(CalculatorError, match=why):
        evaluate(expr)


def test_a_good_call_is_parsed_and_runs_its_tool():
    box = ToolBox.load([CALC])
    assert parse_call(_call("calculator", expression="12*34")) == ("calculator", {"expression": "12*34"})
    reply = box.respond(_call("calculator", expression="12*34"))
    assert reply.ok and reply.content == "408"
    assert box.respond("the answer is 408") is None  # no call: a final answer


@pytest.mark.parametrize("text,why", [
    (f"{OPEN}{{\"name\": \"calculator\", \"arguments\": {{}}}}", "no closing"),
    (f"{OPEN}{{name: calculator}}{CLOSE}", "not JSON"),
    (f"{OPEN}[1, 2]{CLOSE}", "a tool call is"),
    (f"{OPEN}{{\"name\": \"calculator\", \"arguments\": [\"1+1\"]}}{CLOSE}", "must be a JSON object"),
    (_call("python", code="print(1)"), "unknown tool 'python'; accepted: calculator"),
    (_call("calculator", expr="1+1"), "calculator raised TypeError"),
    (_call("calculator", expression="open('/etc/passwd')"), "calculator raised CalculatorError"),
])
def test_a_malformed_call_comes_back_to_the_model_as_an_error_result(text, why):
    reply = ToolBox.load([CALC]).respond(text)
    assert not reply.ok and reply.content.startswith("error: ") and why in reply.content


def test_a_long_result_is_cut(tmp_path):
    f = tmp_path / "tools.py"
    f.write_text("def echo(text):\n    return text * 1000\n")
    reply = ToolBox.load([f"{f}:echo"]).respond(_call("echo", text="ab"))
    assert reply.ok and len(reply.content) < MAX_RESULT_CHARS + 40 and reply.content.endswith("characters]")


@pytest.mark.parametrize("spec,why", [
    ("align.rewards.nope:calc", "cannot import align.rewards.nope"),
    ("align.rewards.calculator:missing", "has no attribute 'missing'"),
    ("align.rewards.calculator:MAX_CHARS", "names a int, not a function"),
    ("calculator", "must name a function as"),
])
def test_a_spec_that_names_no_tool_is_refused_naming_its_key(spec, why):
    with pytest.raises(ConfigError, match=why) as e:
        ToolBox.load([CALC, spec])
    assert e.value.key == "objective.tools[1]"


def test_two_tools_of_one_name_are_refused():
    with pytest.raises(ConfigError, match="a second tool named 'calculator'"):
        tool_names([CALC, "mypkg.tools:calculator"])


def test_a_tool_records_its_file_and_hash():
    tool = load_tool(CALC)
    assert tool.name == "calculator" and tool.file.name == "calculator.py" and len(tool.sha256) == 64
