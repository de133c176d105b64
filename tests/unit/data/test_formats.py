"""Record formats (align/data/formats.py) and file kinds (align/data/files.py): each format is detected
from its records and becomes the chat (or text) the encoder takes, with the loss on the answer only;
every file kind reads the same records; a record that fits two formats, records that mix formats and
a record that fits none are refused in one line; the format is in the manifest's data and the key."""

from __future__ import annotations

import json

import pytest

from align.config import ModelConfig, to_typed
from align.data.encode_cache import cache_key_parts, load_dataset
from align.data.sources import load_records
from align.errors import ConfigError
from tests.unit.data.conftest import data_cfg, write_jsonl

U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text: {"role": "assistant", "content": text}  # noqa: E731
S = lambda text: {"role": "system", "content": text}  # noqa: E731

ALPACA = [{"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
          {"instruction": "Say hi.", "output": "hi"}]


def _records(tmp_path, rows, name="d.jsonl", **kw):
    report: dict = {}
    recs = load_records(data_cfg(write_jsonl(tmp_path / name, rows), tmp_path, **kw), report)
    return recs, report


def _encoded(tmp_path, tokenizer, rows, name="d.jsonl", **kw):
    return load_dataset(data_cfg(write_jsonl(tmp_path / name, rows), tmp_path, **kw), ModelConfig(), tokenizer)


def _split(tokenizer, data, i) -> tuple[str, str]:
    """(context, trained) text of encoded record i: its tokens without and with loss, decoded."""
    t, m = data.row(i)
    return tokenizer.decode(t[~m].tolist()), tokenizer.decode(t[m].tolist())


# ----------------------------------------------------------------------------------- each format


FORMATS = [
    ("messages", {"messages": [U("q"), A("a")]}, [U("q"), A("a")]),
    ("sharegpt", {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "q"},
                                    {"from": "gpt", "value": "a"}]}, [S("be brief"), U("q"), A("a")]),
    ("alpaca", ALPACA[0], [U("Add the numbers.\n2 and 3"), A("5")]),
    ("prompt_completion", {"prompt": "q", "completion": "a"}, [U("q"), A("a")]),
    ("prompt_completion", {"prompt": [S("s"), U("q")], "completion": [A("a")]}, [S("s"), U("q"), A("a")]),
    ("messages", {"messages": [{"role": "user", "content": [{"type": "text", "text": "q"},
                                                            {"type": "text", "text": "!"}]},
                               {"role": "assistant", "content": [{"type": "text", "text": "a"}]}]},
     [U("q!"), A("a")]),
]


@pytest.mark.parametrize("fmt,row,chat", FORMATS, ids=["messages", "sharegpt", "alpaca", "prompt_completion",
                                                       "prompt_completion_chat", "content_parts"])
def test_each_chat_format_is_detected_and_becomes_the_chat_the_encoder_takes(tmp_path, fmt, row, chat):
    [rec], report = _records(tmp_path, [row])
    assert rec.messages == chat and rec.text is None
    assert report["formats"] == {"d": {"format": fmt, "chosen_by": "detected", "file": "jsonl"}}


def test_the_question_answer_fields_of_the_bundled_data_are_prompt_completion(tmp_path):
    _, report = _records(tmp_path, [{"question": "1+1=", "answer": "2"}])
    assert report["formats"]["d"]["format"] == "prompt_completion"


def test_an_alpaca_input_reaches_the_encoded_tokens_as_context(tmp_path, tokenizer):
    data = _encoded(tmp_path, tokenizer, ALPACA)
    context, trained = _split(tokenizer, data, 0)
    assert "2 and 3" in context and "Add the numbers." in context
    assert trained == "5" + tokenizer.eos_token
    without = _encoded(tmp_path, tokenizer, [{k: v for k, v in ALPACA[0].items() if k != "input"}], name="e.jsonl")
    assert "2 and 3" not in _split(tokenizer, without, 0)[0] and len(without.row(0)[0]) < len(data.row(0)[0])


def test_sharegpt_trains_the_gpt_turns_only(tmp_path, tokenizer):
    row = {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "q1"},
                             {"from": "gpt", "value": "alpha"}, {"from": "human", "value": "q2"},
                             {"from": "gpt", "value": "beta"}]}
    context, trained = _split(tokenizer, _encoded(tmp_path, tokenizer, [row]), 0)
    assert trained == "alpha" + tokenizer.eos_token + "beta" + tokenizer.eos_token
    assert "be brief" in context and "q1" in context


def test_a_prompt_completion_record_trains_only_its_completion(tmp_path, tokenizer):
    # an assistant turn inside the prompt is context, as TRL's completion-only loss has it
    row = {"prompt": [U("q1"), A("earlier"), U("q2")], "completion": [A("later")]}
    context, trained = _split(tokenizer, _encoded(tmp_path, tokenizer, [row]), 0)
    assert trained == "later" + tokenizer.eos_token and "earlier" in context


def test_a_text_record_trains_every_token_without_a_chat_template(tmp_path, tokenizer):
    data = _encoded(tmp_path, tokenizer, [{"text": "hello world"}, {"text": "once more"}])
    ids, mask = (a.tolist() for a in data.row(0))
    assert ids == tokenizer("hello world")["input_ids"] + [tokenizer.eos_token_id]
    assert mask == [False] + [True] * (len(ids) - 1)  # position 0: nothing before it predicts it
    assert data.meta["formats"]["d"]["format"] == "text"


def test_a_text_record_is_not_an_rl_prompt(compose, tokenizer, tmp_path):
    from align.data.prompts import load_prompts
    from align.rewards import WeightedReward

    f = write_jsonl(tmp_path / "t.jsonl", [{"text": "1+1=2"}])
    cfg = to_typed(compose(["objective=grpo", "logger=none", "data=jsonl_prompts", f"data.path={f}"]))
    with pytest.raises(ConfigError, match=f"^{f}:1: a text record has no prompt and no reference answer"):
        load_prompts(cfg, tokenizer, WeightedReward(cfg.reward.weights))


# ------------------------------------------------------------------------------------ file kinds


def _write(kind: str, tmp_path, rows):
    import datasets
    import pyarrow as pa

    ds = datasets.Dataset.from_list(rows)
    if kind == "json":
        (p := tmp_path / "d.json").write_text(json.dumps(rows))
    elif kind == "json_lines":
        p = write_jsonl(tmp_path / "d.json", rows)
    elif kind == "parquet":
        ds.to_parquet(str(p := tmp_path / "d.parquet"))
    elif kind in ("arrow_stream", "arrow_file"):
        table = ds.data.table
        new = pa.ipc.new_stream if kind == "arrow_stream" else pa.ipc.new_file
        with new(str(p := tmp_path / "d.arrow"), table.schema) as w:
            w.write_table(table)
    elif kind == "save_to_disk":
        ds.save_to_disk(str(p := tmp_path / "d"))
    else:  # a DatasetDict of one split
        datasets.DatasetDict({"train": ds}).save_to_disk(str(p := tmp_path / "d"))
    return p


KINDS = {"json": "json", "json_lines": "json", "parquet": "parquet", "arrow_stream": "arrow", "arrow_file": "arrow",
         "save_to_disk": "save_to_disk", "dataset_dict": "save_to_disk"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_file_kind_reads_the_records_a_jsonl_file_holds(tmp_path, kind):
    want = load_records(data_cfg(write_jsonl(tmp_path / "d.jsonl", ALPACA), tmp_path))
    (tmp_path / kind).mkdir()
    path = _write(kind, tmp_path / kind, ALPACA)
    report: dict = {}
    got = load_records(data_cfg(path, tmp_path, source="parquet" if kind == "parquet" else "jsonl"), report)
    # the second record has no input: a columnar file holds a null there, which is no field
    assert [(r.id, r.messages) for r in got] == [(r.id, r.messages) for r in want]
    assert report["formats"]["d"] == {"format": "alpaca", "chosen_by": "detected", "file": KINDS[kind]}


def test_preference_pairs_load_from_a_save_to_disk_directory(tmp_path, tokenizer):
    from align.data.preference import load_pairs
    from tests.unit.data.test_preference import train_cfg

    rows = [{"chosen": [U("2+2?"), A("4")], "rejected": [U("2+2?"), A("5")]},
            {"chosen": [U("3+3?"), A("6")], "rejected": [U("3+3?"), A("7")]}]
    pairs = load_pairs(train_cfg(tmp_path, _write("save_to_disk", tmp_path, rows)), tokenizer)
    assert pairs.pairs == 2 and tokenizer.decode(pairs.row(0)[0][pairs.row(0)[1]].tolist()) == "4" + tokenizer.eos_token
    assert pairs.meta["formats"]["d"] == {"format": "preference", "chosen_by": "detected", "file": "save_to_disk"}


def test_a_dataset_dict_of_several_splits_or_a_plain_directory_is_refused(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(ALPACA)
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=r"^data.path: .*dd is a DatasetDict of splits \['test', 'train'\]; "
                                          r"accepted: one split's directory"):
        load_records(data_cfg(tmp_path / "dd", tmp_path))
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match="plain is a directory; accepted: a JSONL file .* save_to_disk directory"):
        load_records(data_cfg(tmp_path / "plain", tmp_path))


def test_a_file_that_is_not_what_its_name_says_is_one_line(tmp_path):
    f = tmp_path / "d.arrow"
    f.write_text("not arrow")
    with pytest.raises(ConfigError) as e:
        load_records(data_cfg(f, tmp_path))
    assert str(e.value).startswith(f"data.path: not a readable Arrow file: {f} (") and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------- refusals


def test_a_record_that_fits_two_formats_is_refused_unless_the_format_is_named(tmp_path):
    # Alpaca dumps often carry the whole prompt in `text` too: alpaca or text is the user's call
    rows = [{**ALPACA[0], "text": "### Instruction: Add the numbers. ..."}]
    with pytest.raises(ConfigError) as e:
        _records(tmp_path, rows)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'd.jsonl'}:1: the record fits 2 formats, alpaca, text") and "\n" not in msg
    assert "accepted: data.format=alpaca or data.format=text" in msg
    [rec], report = _records(tmp_path, rows, format="alpaca")
    assert rec.messages[0]["content"] == "Add the numbers.\n2 and 3" and rec.text is None
    assert report["formats"]["d"]["chosen_by"] == "data.format"
    [rec], _ = _records(tmp_path, rows, format="text")
    assert rec.text == rows[0]["text"] and rec.messages == []


def test_records_that_mix_formats_are_refused_unless_the_format_is_named(tmp_path):
    rows = [{"messages": [U("q"), A("a")]}, {"messages": [U("q2"), A("a2")]}, ALPACA[0]]
    f = tmp_path / "d.jsonl"
    with pytest.raises(ConfigError) as e:
        _records(tmp_path, rows)
    assert str(e.value) == (f"data.format: the records of {f} mix formats: messages ({f}:1), alpaca ({f}:3); "
                            "accepted: one format per source (one file per format, as a mixture), or "
                            "data.format=<one of them>, under which records of the others are bad records")
    with pytest.raises(ConfigError, match=f"^{f}:3: record has no 'messages'"):
        _records(tmp_path, rows, format="messages")
    recs, report = _records(tmp_path, rows, format="messages", on_bad_record="skip")
    assert [r.id for r in recs] == ["d:1", "d:2"] and report["skipped_bad"] == 1


def test_a_mixture_detects_each_sources_format_on_its_own(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"messages": [U("q"), A("a")]}])
    b = write_jsonl(tmp_path / "b.jsonl", ALPACA)
    report: dict = {}
    cfg = data_cfg(None, tmp_path, mixture={"a": {"kind": "jsonl", "path": str(a)},
                                            "b": {"kind": "jsonl", "path": str(b), "format": "alpaca"}})
    assert len(load_records(cfg, report)) == 3
    assert {n: (f["format"], f["chosen_by"]) for n, f in report["formats"].items()} == {
        "a": ("messages", "detected"), "b": ("alpaca", "data.mixture.b.format")}
    cfg = data_cfg(None, tmp_path, format="alpaca", mixture={"b": {"kind": "jsonl", "path": str(b)}})
    load_records(cfg, report)
    assert report["formats"]["b"]["chosen_by"] == "data.format"  # inherited from data.*


def test_a_record_that_fits_no_format_names_file_record_and_the_formats(tmp_path):
    f = tmp_path / "d.jsonl"
    with pytest.raises(ConfigError) as e:
        _records(tmp_path, [ALPACA[0], {"question_text": "q", "reply": "a"}])
    msg = str(e.value)
    assert msg.startswith(f"{f}:2: record fits no data format (fields ['question_text', 'reply']); accepted: ")
    for shape in ('messages {"messages"', 'sharegpt {"conversations"', 'alpaca {"instruction"', 'text {"text"}',
                  'prompt_completion {"question", "answer"} or {"prompt", "completion"}'):
        assert shape in msg, shape
    assert "\n" not in msg


def test_pairs_where_chats_are_expected_and_chats_where_pairs_are_are_refused(tmp_path, tokenizer):
    from align.data.preference import load_pairs
    from tests.unit.data.test_preference import train_cfg

    pairs = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}])
    with pytest.raises(ConfigError, match=f"^data.path: {pairs} holds preference pairs .*objective=dpo"):
        load_records(data_cfg(pairs, tmp_path))
    chats = write_jsonl(tmp_path / "c.jsonl", [{"conversations": [{"from": "human", "value": "q"}]}])
    with pytest.raises(ConfigError, match=f"^data.path: {chats} holds sharegpt records .*not preference pairs"):
        load_pairs(train_cfg(tmp_path, chats), tokenizer)


def test_a_format_of_the_other_family_is_refused_at_compose_time(tmp_path):
    with pytest.raises(ConfigError, match="^data.format: preference does not fit a jsonl source"):
        data_cfg(tmp_path / "d.jsonl", tmp_path, format="preference")
    with pytest.raises(ConfigError, match="^data.mixture.b.format: messages does not fit a preference source"):
        data_cfg(None, tmp_path, mixture={"b": {"kind": "preference", "path": "p.jsonl", "format": "messages"}})


# ------------------------------------------------------------------------- manifest and cache key


def test_the_format_is_in_the_encodings_provenance_on_a_miss_and_a_hit(tmp_path, tokenizer):
    cfg = data_cfg(write_jsonl(tmp_path / "d.jsonl", ALPACA), tmp_path)
    miss = load_dataset(cfg, ModelConfig(), tokenizer)
    hit = load_dataset(cfg, ModelConfig(), tokenizer)
    assert (miss.meta["cache_hit"], hit.meta["cache_hit"]) == (False, True)
    want = {"d": {"format": "alpaca", "chosen_by": "detected", "file": "jsonl"}}
    assert miss.meta["formats"] == hit.meta["formats"] == want
    assert "formats" not in miss.stats


def test_the_cache_key_covers_the_format_and_the_file_kind(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", ALPACA)
    keys = {fmt: cache_key_parts(data_cfg(f, tmp_path, format=fmt), ModelConfig())["key"]
            for fmt in ("auto", "alpaca", "text", "messages")}
    assert len(set(keys.values())) == 4
    assert keys["auto"] == cache_key_parts(data_cfg(f, tmp_path), ModelConfig())["key"]
    # the same bytes read as JSON through `datasets` number their records by row, not by line
    g = write_jsonl(tmp_path / "d.json", ALPACA)
    assert cache_key_parts(data_cfg(g, tmp_path), ModelConfig())["key"] != keys["auto"]


def test_the_cache_key_of_a_save_to_disk_directory_follows_its_content(tmp_path):
    import shutil

    import datasets

    d = tmp_path / "d"
    datasets.Dataset.from_list(ALPACA).save_to_disk(str(d))
    key = cache_key_parts(data_cfg(d, tmp_path), ModelConfig())["key"]
    assert [r.where for r in load_records(data_cfg(d, tmp_path))] == [f"{d}:1", f"{d}:2"]
    shutil.rmtree(d)
    datasets.Dataset.from_list(ALPACA[::-1]).save_to_disk(str(d))  # the same path, other content
    assert cache_key_parts(data_cfg(d, tmp_path), ModelConfig())["key"] != key


def test_inspect_shows_the_format_and_the_masked_input(tmp_path, capsys):
    from align.tools import inspect as align_inspect

    f = write_jsonl(tmp_path / "alpaca.jsonl", ALPACA)
    assert align_inspect.main(["data=jsonl", f"data.path={f}", f"data.cache_dir={tmp_path / 'cache'}", "index=0"]) == 0
    out = capsys.readouterr().out
    assert f"source alpaca: {f}, format alpaca (detected)" in out
    body = out.split("-" * 100)[1]
    assert "2 and 3" in body and "[[5" in body and "2 and 3" not in "".join(body.split("[[")[1:])
