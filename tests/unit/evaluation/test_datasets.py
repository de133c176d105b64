"""Records are read strictly and cheaply: a missing field, an unreadable reference, bad JSON is one
ConfigError naming file:line, found before any generation."""

from __future__ import annotations

import json

import pytest

from align.core.hashing import sha256_file
from align.data.sources import bundled_gsm8k
from align.errors import ConfigError
from align.evaluation.config import EvalConfig, EvalTask
from align.evaluation.datasets import load_data
from align.rewards import get_verifier


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_the_bundled_test_split_whole_and_limited():
    data = load_data(EvalConfig(), get_verifier("gsm8k"))
    assert data.bundled and len(data.items) == 1319 and data.sha256 == sha256_file(bundled_gsm8k("test"))
    first = json.loads(bundled_gsm8k("test").open().readline())
    item = data.items[0]
    assert (item.prompt, item.reference, item.id) == (first["question"], first["answer"], "test:1")
    limited = load_data(EvalConfig(limit=5))
    assert [it.index for it in limited.items] == list(range(5)) and limited.sha256 == data.sha256
    assert limited.meaning(EvalConfig(limit=5))["limit"] == 5 and data.meaning(EvalConfig())["limit"] is None


def test_a_prompts_file_with_ids(tmp_path):
    f = _jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "key": 7}, "", {"prompt": "b", "key": 8}])
    data = load_data(EvalConfig(task=EvalTask.refusal, prompts=str(f), prompt_field="prompt", id_field="key"))
    assert [(it.id, it.prompt, it.reference) for it in data.items] == [("p:7", "a", None), ("p:8", "b", None)]


@pytest.mark.parametrize("rows,where,says", [
    ([{"prompt": "a"}, {"question": "b"}], ":2", "no field 'prompt' (set eval.prompt_field)"),
    ([{"prompt": "a"}, "{not json"], ":2", "malformed JSON"),
    ([["a list"]], ":1", "must be a JSON object"),
    ([{"prompt": ""}], ":1", "non-empty string"),
    ([{"prompt": 3}], ":1", "non-empty string"),
])
def test_bad_prompt_records(tmp_path, rows, where, says):
    f = _jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(ConfigError) as e:
        load_data(EvalConfig(task=EvalTask.refusal, prompts=str(f), prompt_field="prompt"))
    assert str(e.value).startswith(f"{f}{where}: ") and says in str(e.value)


def test_a_reference_the_verifier_cannot_read_is_refused_up_front(tmp_path):
    f = _jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "#### 4"}, {"question": "q", "answer": "#### four"}])
    assert len(load_data(EvalConfig(prompts=str(f)), None).items) == 2  # no verifier: no check
    with pytest.raises(ConfigError, match=r"g.jsonl:2: the gsm8k verifier cannot read the reference"):
        load_data(EvalConfig(prompts=str(f)), get_verifier("gsm8k"))
    with pytest.raises(ConfigError, match="no field 'answer' .set eval.reference_field"):
        load_data(EvalConfig(prompts=str(_jsonl(tmp_path / "h.jsonl", [{"question": "q"}]))))


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ConfigError, match="eval.prompts: no such file"):
        load_data(EvalConfig(prompts=str(tmp_path / "none.jsonl")))
    with pytest.raises(ConfigError, match="eval.prompts: no records"):
        load_data(EvalConfig(prompts=str(_jsonl(tmp_path / "e.jsonl", [""]))))
