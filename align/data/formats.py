"""Record formats: which shape a source's records have, and each record as the encoders take it.

A source's format is `data.format` (per mixture source: `data.mixture.<name>.format`), or, under
`auto`, detected from its records: every record's fields are matched against every format (a field
that is null counts as absent: a columnar file holds every column in every row). Detection must be
unambiguous: a record that fits two formats, or records that fit different ones, are refused in one
line naming the records and the formats, and the user names the format. A record that fits none is a
bad record naming `file:record` and the formats accepted.

Each chat format becomes what align/data/encode.py encodes: a chat of {role, content} whose assistant
turns carry loss (a prompt/completion record: only the completion's), or a text whose every token
does (`text`). Preference records are parsed by align/data/preference.py; only their detection is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from align.config import DataFormat
from align.data.files import BadRecord
from align.errors import ConfigError

ROLES = ("system", "user", "assistant")
"""Roles a chat may hold. Assistant turns are trained on; the others are context. Any other role
(a typo, or `tool` outside a `messages` record: below) would be rendered as the template pleases and
trained around: refused."""
MESSAGES_ROLES = (*ROLES, "tool")
"""Roles a `messages` record may hold: also `tool`, a tool's result as context (no loss). The call is in
the assistant turn's text and the result is the tool message's content, the {role, content} form GRPO's
tool rollouts render (align/objectives/multi_turn.py), so such a record is a demonstration of them."""
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
CHAT_FORMATS = tuple(f for f in DataFormat if f not in (DataFormat.auto, DataFormat.preference))
PAIR_FORMATS = (DataFormat.preference,)


@dataclass(frozen=True)
class Chat:
    """A record as the encoder takes it: a chat, or (format text) a text and no chat."""

    messages: list[dict[str, str]]
    untrained: tuple[int, ...] = ()
    """Assistant turns that are context, not trained on (those of a prompt/completion record's prompt)."""
    text: Optional[str] = None


def response_fields(spec: Any) -> list[tuple[str, str]]:
    """The (prompt, completion) field pairs of a prompt/completion record: the configured ones, TRL's."""
    return list(dict.fromkeys([(spec.prompt_field, spec.response_field), ("prompt", "completion")]))


def fits(row: dict, spec: Any) -> list[DataFormat]:
    """Every format whose fields the record holds (not null), in DataFormat order."""
    def has(*keys: str) -> bool:
        return all(row.get(k) is not None for k in keys)

    rules = {
        DataFormat.messages: has(spec.messages_field),
        DataFormat.sharegpt: has("conversations"),
        DataFormat.alpaca: has("instruction", "output"),
        DataFormat.text: has("text"),
        DataFormat.prompt_completion: any(has(p, r) for p, r in response_fields(spec)),
        DataFormat.preference: has("chosen", "rejected"),
    }
    return [f for f, ok in rules.items() if ok]


def shape(fmt: DataFormat, spec: Any) -> str:
    """One line of what a record of `fmt` holds, with the configured field names."""
    pc = " or ".join("{" + f'"{p}", "{r}"' + "}" for p, r in response_fields(spec))
    return {
        DataFormat.messages: '{"%s": [{"role", "content"}, ...]}' % spec.messages_field,
        DataFormat.sharegpt: '{"conversations": [{"from": "human" | "gpt" | "system", "value"}, ...]}',
        DataFormat.alpaca: '{"instruction", "input" (optional), "output"}',
        DataFormat.text: '{"text"}',
        DataFormat.prompt_completion: f"{pc}, each a string or a chat",
        DataFormat.preference: '{"prompt", "chosen", "rejected"} or {"chosen": [chat], "rejected": [chat]}',
    }[fmt]


def accepted(formats: Iterable[DataFormat], spec: Any) -> str:
    return "; ".join(f"{f.value} {shape(f, spec)}" for f in formats)


def no_format(row: dict, spec: Any, formats: Iterable[DataFormat]) -> BadRecord:
    keys = sorted(k for k, v in row.items() if v is not None)
    nulls = sorted(k for k, v in row.items() if v is None)
    null = f", null: {nulls}" if nulls else ""
    return BadRecord(f"record fits no data format (fields {keys}{null}); accepted: {accepted(formats, spec)}")


def resolve(rows: list[tuple[int, Any]], spec: Any, pairs: bool) -> tuple[Optional[DataFormat], str]:
    """(format, how it was chosen) of one source: `spec.format` when named, else detected from `rows`
    ((number, row or BadRecord) as align.data.files.read_rows gives them). Refuses, naming the records,
    a record that fits two formats, records that fit different ones, and a format of the other family
    (pairs on a chat source, chats on a pair source). None: no record fits any format."""
    fmt_key = f"{spec.key}.format"
    if spec.format != DataFormat.auto:
        return spec.format, spec.format_key
    first: dict[DataFormat, str] = {}
    for n, row in rows:
        if isinstance(row, BadRecord):
            continue
        found = fits(row, spec)
        if len(found) > 1:
            names = " or ".join(f"{fmt_key}={f.value}" for f in found)
            raise ConfigError(f"{spec.path}:{n}", f"the record fits {len(found)} formats, "
                              f"{', '.join(f.value for f in found)}: detection is ambiguous; accepted: {names}")
        if found:
            first.setdefault(found[0], f"{spec.path}:{n}")
    if len(first) > 1:
        mix = ", ".join(f"{f.value} ({where})" for f, where in first.items())
        raise ConfigError(fmt_key, f"the records of {spec.path} mix formats: {mix}; accepted: one format per source "
                          f"(one file per format, as a mixture), or {fmt_key}=<one of them>, under which records of "
                          "the others are bad records")
    fmt = next(iter(first), None)
    if fmt is not None and fmt.pairs != pairs:
        where = first[fmt]
        if pairs:
            raise ConfigError(f"{spec.key}.path", f"{spec.path} holds {fmt.value} records ({where}: chats for SFT), "
                              f"not preference pairs; accepted: {accepted(PAIR_FORMATS, spec)}")
        raise ConfigError(f"{spec.key}.path", f"{spec.path} holds preference pairs ({where}), which a preference "
                          "objective trains on (objective=dpo data=preference); accepted here: chat records, "
                          f"{accepted(CHAT_FORMATS, spec)}")
    return fmt, "detected"


# ------------------------------------------------------------------------------------ chat formats


def text_of(value: Any, what: str) -> str:
    # str(None) is "None" and str(3) is "3": the model would be trained on text nobody wrote.
    if not isinstance(value, str):
        got = "null" if value is None else f"of type {type(value).__name__}"
        raise BadRecord(f"{what} is {got}; accepted: a string")
    return value


def content_of(value: Any, what: str) -> str:
    """A message's content: a string, or a list of text parts, concatenated in order (the loss mask is
    cut from rendered text, so a part that is not text cannot be trained around: refused)."""
    if not isinstance(value, list):
        if isinstance(value, str):
            return value
        got = "null" if value is None else f"of type {type(value).__name__}"
        raise BadRecord(f"{what} is {got}; accepted: a string or a list of text parts "
                        '[{"type": "text", "text": ...}]')
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise BadRecord(f"{what}[{j}] is a part of type {kind!r}; accepted: text parts "
                            '{"type": "text", "text": ...} (the loss mask is cut from rendered text)')
        texts.append(text_of(part.get("text"), f"{what}[{j}].text"))
    return "".join(texts)


def message(m: Any, what: str, role_key: str = "role", content_key: str = "content",
            roles: Optional[dict[str, str]] = None) -> dict[str, str]:
    """One {role, content} message; `roles` maps the record's role names onto system/user/assistant."""
    roles = roles or {r: r for r in ROLES}
    if not isinstance(m, dict) or role_key not in m or content_key not in m:
        got = f"keys {sorted(m)}" if isinstance(m, dict) else f"type {type(m).__name__}"
        raise BadRecord(f"{what} must be an object with '{role_key}' and '{content_key}' (got {got})")
    role = text_of(m[role_key], f"{what}.{role_key}")
    if role not in roles:
        raise BadRecord(f"{what}.{role_key} is {role!r}; accepted: {', '.join(roles)}")
    return {"role": roles[role], "content": content_of(m[content_key], f"{what}.{content_key}")}


def _chat(value: Any, field: str, **kw: Any) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise BadRecord(f"field '{field}' must be a list of {{role, content}}")
    return [message(m, f"'{field}'[{i}]", **kw) for i, m in enumerate(value)]


def _need(row: dict, fmt: DataFormat, spec: Any, *keys: str) -> None:
    missing = [k for k in keys if row.get(k) is None]
    if missing:
        raise BadRecord(f"record has no '{missing[0]}' (fields {sorted(row)}); {fmt.value}: {shape(fmt, spec)}")


def _messages(row: dict, spec: Any) -> Chat:
    _need(row, DataFormat.messages, spec, spec.messages_field)
    return Chat(_chat(row[spec.messages_field], spec.messages_field, roles={r: r for r in MESSAGES_ROLES}))


def _sharegpt(row: dict, spec: Any) -> Chat:
    _need(row, DataFormat.sharegpt, spec, "conversations")
    return Chat(_chat(row["conversations"], "conversations", role_key="from", content_key="value",
                      roles=SHAREGPT_ROLES))


def _alpaca(row: dict, spec: Any) -> Chat:
    _need(row, DataFormat.alpaca, spec, "instruction", "output")
    prompt = text_of(row["instruction"], "field 'instruction'")
    extra = row.get("input")
    if extra is not None and text_of(extra, "field 'input'"):
        prompt = f"{prompt}\n{extra}"  # the input follows the instruction, on its own line
    return Chat([{"role": "user", "content": prompt},
                 {"role": "assistant", "content": text_of(row["output"], "field 'output'")}])


def _text(row: dict, spec: Any) -> Chat:
    _need(row, DataFormat.text, spec, "text")
    text = text_of(row["text"], "field 'text'")
    if not text.strip():
        raise BadRecord("field 'text' is empty: nothing to train on")
    return Chat([], text=text)


def _side(value: Any, field: str, role: Optional[str]) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": role or "user", "content": value}]
    if not isinstance(value, list) or not value:
        got = "an empty list" if isinstance(value, list) else f"of type {type(value).__name__}"
        raise BadRecord(f"field '{field}' is {got}; accepted: a string or a non-empty list of {{role, content}}")
    chat = _chat(value, field)
    if role is not None and any(m["role"] != role for m in chat):
        raise BadRecord(f"field '{field}' holds roles {[m['role'] for m in chat]}; accepted: {role} messages only")
    return chat


def _prompt_completion(row: dict, spec: Any) -> Chat:
    found = [(p, r) for p, r in response_fields(spec) if row.get(p) is not None and row.get(r) is not None]
    if len(found) != 1:
        what = "both " + " and ".join(f"{p}/{r}" for p, r in found) if found else "no prompt/completion fields"
        raise BadRecord(f"record has {what} (fields {sorted(row)}); prompt_completion: "
                        f"{shape(DataFormat.prompt_completion, spec)}")
    p, r = found[0]
    prompt = _side(row[p], p, None)
    if prompt[-1]["role"] == "assistant":
        raise BadRecord(f"field '{p}' ends with an assistant turn; accepted: a prompt the completion answers")
    completion = _side(row[r], r, "assistant")
    untrained = tuple(i for i, m in enumerate(prompt) if m["role"] == "assistant")
    return Chat(prompt + completion, untrained=untrained)


ADAPTERS: dict[DataFormat, Callable[[dict, Any], Chat]] = {
    DataFormat.messages: _messages, DataFormat.sharegpt: _sharegpt, DataFormat.alpaca: _alpaca,
    DataFormat.text: _text, DataFormat.prompt_completion: _prompt_completion,
}


def to_chat(row: dict, spec: Any, fmt: Optional[DataFormat], how: str) -> Chat:
    """The record as the encoder takes it. A detected format (`how` == "detected") takes only the
    records that fit it; a named one tries every record, and a record without its fields is bad."""
    if fmt is None or how == "detected" and fmt not in fits(row, spec):
        raise no_format(row, spec, CHAT_FORMATS)
    return ADAPTERS[fmt](row, spec)
