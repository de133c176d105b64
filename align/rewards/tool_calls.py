"""Tools a GRPO trajectory may call (`objective.tools`, docs/grpo.md#tools): Python callables named like
python rewards (`pkg.module:fn` or `/path/to/file.py:fn`, align/rewards/function.py), each called by the
name after the colon's last dot. The bundled one is `align.rewards.calculator:calculator`.

A tool is called with the call's arguments as keywords, `fn(**arguments)`, and its result is turned into
text (`str`). The model asks for one in its turn's text, in this tag format (the bundled tokenizer's chat
template has no tool-call syntax of its own, so align defines one):

    <tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>

`ToolBox.respond(text)` reads the first such call: None when the text has none (the turn is a final
answer), else the text of the tool message the model gets back. Everything the model got wrong comes
back as that text, starting with `error:`, so the model can learn from it and the run goes on: a
missing closing tag, arguments that are not a JSON object, an unknown tool, arguments the tool does not
take or a tool that raises. Nothing the model writes is executed as code: it is parsed as JSON and
handed to a function the config named. The one tool that runs the model's code is
`align.rewards.sandbox:python`, in a process cut off from the network and bounded in time and memory, and
only where a config names it. A tool object with a `preflight()` method has it called when the tool is
loaded (preflight, exit 2 before heavy work): a ValueError there refuses the run with its message.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from align.errors import ConfigError
from align.rewards.function import _first, _sha256, import_spec, source_file, split_spec

OPEN, CLOSE = "<tool_call>", "</tool_call>"
"""The tags around a tool call in the model's turn."""
MAX_RESULT_CHARS = 500
"""A tool result longer than this is cut (and says so): one result cannot fill the trajectory."""
KEY = "objective.tools"


def call_text(name: str, **arguments: Any) -> str:
    """A tool call as the model writes it (what `parse_call` reads), e.g. the bundled multiplication task's
    demonstrations (align/data/synthetic.py)."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE}"


def tool_name(spec: str, key: str = KEY) -> str:
    """The name the model calls the tool `spec` names by: its attribute path's last part."""
    return split_spec(spec, key)[1].rpartition(".")[2]


def tool_names(specs: Sequence[str], key: str = KEY) -> list[str]:
    """Each spec's tool name, checked without importing anything (config time): a spec of the accepted
    shape, and no two tools of one name."""
    if isinstance(specs, str) or not isinstance(specs, Sequence):
        raise ConfigError(key, "must be a list of tools, e.g. [align.rewards.calculator:calculator]", specs)
    names = [tool_name(s, f"{key}[{i}]") for i, s in enumerate(specs)]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise ConfigError(f"{key}[{i}]", f"a second tool named {n!r}: the model calls tools by name", specs[i])
    return names


@dataclass(frozen=True)
class Tool:
    name: str
    spec: str
    fn: Callable[..., Any]
    file: Optional[Path]
    sha256: Optional[str]

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "function": self.spec, "file": None if self.file is None else str(self.file),
                "sha256": self.sha256}


def load_tool(spec: str, key: str = KEY) -> Tool:
    """The tool `spec` names, imported; ConfigError naming `key` for a missing module, file or attribute, a
    non-callable, an async function or a tool whose `preflight()` refuses the machine (one line, exit 2:
    preflight loads every tool before heavy work)."""
    fn, module = import_spec(spec, key)
    if not callable(fn):
        raise ConfigError(key, f"names a {type(fn).__name__}, not a function", spec)
    call = fn if inspect.isroutine(fn) or inspect.isclass(fn) else type(fn).__call__
    if inspect.iscoroutinefunction(call):
        raise ConfigError(key, "is an async function; accepted: a plain function fn(**arguments) -> str", spec)
    ready = getattr(fn, "preflight", None)  # a tool that needs something of the machine says so here
    if callable(ready):
        try:
            ready()
        except ValueError as e:
            raise ConfigError(key, str(e), spec) from None
    file = source_file(fn, module)
    return Tool(tool_name(spec, key), spec, fn, file, _sha256(file) if file is not None and file.is_file() else None)


@dataclass(frozen=True)
class Response:
    """What the environment answers a turn that called a tool."""

    content: str
    """The tool message's text: the result, or `error: ...`."""
    ok: bool
    """The tool ran and returned; False for every `error:` result."""


def parse_call(text: str) -> Optional[tuple[str, dict[str, Any]] | str]:
    """The first tool call in `text`: None when there is none, (name, arguments) for a well-formed one, and
    the error message (a str) for a malformed one."""
    start = text.find(OPEN)
    if start < 0:
        return None
    end = text.find(CLOSE, start)
    if end < 0:
        return f"error: the tool call has no closing {CLOSE}"
    body = text[start + len(OPEN):end].strip()
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return f"error: the tool call is not JSON ({e.msg} at character {e.pos})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'error: a tool call is {"name": <tool>, "arguments": {...}}'
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return "error: the tool call's arguments must be a JSON object"
    return call["name"], arguments


class ToolBox:
    """The tools of a run, by name; `respond` answers a model turn."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools = {t.name: t for t in tools}

    @classmethod
    def load(cls, specs: Sequence[str], key: str = KEY) -> "ToolBox":
        tool_names(specs, key)
        return cls([load_tool(s, f"{key}[{i}]") for i, s in enumerate(specs)])

    def identity(self) -> list[dict[str, Any]]:
        return [t.identity() for t in self.tools.values()]

    def respond(self, text: str) -> Optional[Response]:
        """None when `text` calls no tool; else the tool message's text (module docstring)."""
        call = parse_call(text)
        if call is None:
            return None
        if isinstance(call, str):
            return Response(call, False)
        name, arguments = call
        tool = self.tools.get(name)
        if tool is None:
            return Response(f"error: unknown tool {name!r}; accepted: {', '.join(self.tools)}", False)
        try:
            out = tool.fn(**arguments)
        except Exception as e:  # the model's arguments or the tool's own failure: the model is told, the run goes on
            return Response(f"error: {name} raised {type(e).__name__}: {_first(e)}", False)
        content = str(out)
        if len(content) > MAX_RESULT_CHARS:
            content = content[:MAX_RESULT_CHARS] + f" [cut at {MAX_RESULT_CHARS} characters]"
        return Response(content, True)
