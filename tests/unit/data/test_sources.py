"""Sources: JSONL and Parquet with configurable fields, mixtures, roots and ids; bad records name
file:line and fail or are skipped (counted) per data.on_bad_record."""

from __future__ import annotations

import collections

import pytest

from align.data.sources import load_records, source_specs
from align.errors import ConfigError
from tests.unit.data.conftest import chat, data_cfg, write_jsonl


def test_jsonl_with_messages_or_configured_prompt_response_fields(tmp_path):
    f = write_jsonl(tmp_path / "mine.jsonl", [chat("hi", "there"), chat("again", "here")])
    g = write_jsonl(tmp_path / "yours.jsonl", [{"ask": "why", "say": "because"}])
    recs = load_records(data_cfg(f, tmp_path, prompt_field="ask", response_field="say"))
    assert [r.id for r in recs] == ["mine:1", "mine:2"] and {r.root for r in recs} == {"mine"}
    [rec] = load_records(data_cfg(g, tmp_path, prompt_field="ask", response_field="say"))
    assert rec.messages == [{"role": "user", "content": "why"}, {"role": "assistant", "content": "because"}]


def test_parquet_source(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "response": ["c", "d"], "topic": ["x", "y"]}), f)
    recs = load_records(data_cfg(f, tmp_path, source="parquet", prompt_field="prompt", response_field="response",
                                 root_field="topic"))
    assert [(r.id, r.root) for r in recs] == [("p:1", "p/topic=x"), ("p:2", "p/topic=y")]
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ConfigError, match="not a readable Parquet file"):
        load_records(data_cfg(bad, tmp_path, source="parquet"))


def test_mixture_keeps_every_records_root_and_source(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [chat("q", "a")] * 3)
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "p", "response": "r", "id": "x7"}])
    cfg = data_cfg(None, tmp_path, mixture={"alpha": {"kind": "jsonl", "path": str(a), "weight": 2.0},
                                            "beta": {"kind": "jsonl", "path": str(b), "prompt_field": "prompt",
                                                     "response_field": "response", "id_field": "id"}})
    recs = load_records(cfg)
    assert [(r.id, r.root, r.source) for r in recs] == [
        ("alpha:1", "alpha", 0), ("alpha:2", "alpha", 0), ("alpha:3", "alpha", 0), ("beta:x7", "beta", 1)]
    assert [s.weight for s in source_specs(cfg)] == [2.0, 1.0]


def test_bundled_gsm8k_roots_are_reasoning_steps(tmp_path):
    recs = load_records(data_cfg(None, tmp_path, source="gsm8k", prompt_field="question", response_field="answer",
                                 root_field="steps", max_records=300))
    roots = collections.Counter(r.root for r in recs)
    assert len(roots) >= 5 and all(k.startswith("gsm8k/steps=") for k in roots)
    first = recs[0]  # "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 ...\n#### 72"
    assert first.root == "gsm8k/steps=2" and first.id == "gsm8k:1"


def test_malformed_line_names_file_and_line_and_fails_by_default(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", [chat("q", "a"), chat("q", "a"), '{"messages": [', chat("q", "a")])
    with pytest.raises(ConfigError) as e:
        load_records(data_cfg(f, tmp_path))
    assert str(e.value).startswith(f"{f}:3: malformed JSON") and "data.on_bad_record=skip" in str(e.value)


def test_skip_policy_counts_and_names_skipped_records(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", [chat("q", "a"), "{bad", {"other": 1}, [1, 2], chat("q", "a")])
    report: dict = {}
    recs = load_records(data_cfg(f, tmp_path, on_bad_record="skip"), report)
    assert [r.id for r in recs] == ["c:1", "c:5"]
    assert report["skipped_bad"] == 3
    assert [w.split(": ")[0] for w in report["skipped_where"]] == [f"{f}:2", f"{f}:3", f"{f}:4"]


@pytest.mark.parametrize("rows,match", [
    ([], "no usable records"),
    (["{bad"], "no usable records"),
    ([{"messages": [{"role": "user", "content": "only a question"}]}], "no assistant turn"),
    ([{"messages": "nope"}], "must be a list of"),
])
def test_empty_or_unusable_sources_are_refused(tmp_path, rows, match):
    f = write_jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(ConfigError, match=match):
        load_records(data_cfg(f, tmp_path, on_bad_record="skip" if rows == ["{bad"] else "fail"))


def test_duplicate_ids_and_missing_fields_are_bad_records(tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", [{**chat("q", "a"), "id": 1}, {**chat("q", "a"), "id": 1}])
    with pytest.raises(ConfigError, match="duplicate record id 'c:1'"):
        load_records(data_cfg(f, tmp_path, id_field="id"))
    with pytest.raises(ConfigError, match="no root field 'topic'"):
        load_records(data_cfg(f, tmp_path, root_field="topic"))


def _msgs(*pairs) -> dict:
    return {"messages": list(pairs)}


BAD_CHATS = [
    (_msgs({"role": "user", "content": "q"}, {"role": "assistant", "content": None}),
     "'messages'[1].content is null; accepted: a string"),
    (_msgs({"role": "wizard", "content": "abracadabra"}, {"role": "assistant", "content": "a"}),
     "'messages'[0].role is 'wizard'; accepted: system, user, assistant, tool"),
    (_msgs({"role": "user", "content": 42}, {"role": "assistant", "content": "a"}),
     "'messages'[0].content is of type int; accepted: a string"),
    (_msgs({"role": "user", "content": [{"type": "image", "image": "q.png"}]}, {"role": "assistant", "content": "a"}),
     "'messages'[0].content[0] is a part of type 'image'; accepted: text parts"),
    (_msgs({"role": "user"}, {"role": "assistant", "content": "a"}),
     "'messages'[0] must be an object with 'role' and 'content' (got keys ['role'])"),
    (_msgs({"role": None, "content": "q"}, {"role": "assistant", "content": "a"}), "'messages'[0].role is null"),
    (_msgs("just text", {"role": "assistant", "content": "a"}), "'messages'[0] must be an object"),
    ({"question": None, "answer": "a"}, "record fits no data format (fields ['answer'], null: ['question'])"),
    ({"question": "q", "answer": 7}, "field 'answer' is of type int; accepted: a string"),
]


@pytest.mark.parametrize("row,match", BAD_CHATS, ids=[m.split(";")[0] for _, m in BAD_CHATS])
def test_a_chat_that_would_train_invented_text_is_refused_with_file_line(tmp_path, row, match):
    # str(None) would train the literal "None"; an unknown role would be rendered as the template pleases
    fine = chat("fine", "ok") if "messages" in row else {"question": "fine", "answer": "ok"}
    f = write_jsonl(tmp_path / "c.jsonl", [fine, row])
    with pytest.raises(ConfigError) as e:
        load_records(data_cfg(f, tmp_path, prompt_field="question", response_field="answer"))
    msg = str(e.value)
    assert msg.startswith(f"{f}:2: ") and match in msg and "\n" not in msg, msg


def test_skip_policy_counts_and_drops_bad_chats(tmp_path):
    rows = [chat("q", "a"), *(row for row, _ in BAD_CHATS), chat("q2", "a2")]
    f = write_jsonl(tmp_path / "c.jsonl", rows)
    report: dict = {}
    recs = load_records(data_cfg(f, tmp_path, prompt_field="question", response_field="answer", on_bad_record="skip",
                                 format="messages"), report)
    assert [r.id for r in recs] == ["c:1", f"c:{len(rows)}"]
    assert report["skipped_bad"] == len(BAD_CHATS)
    assert all("None" not in m["content"] for r in recs for m in r.messages)
