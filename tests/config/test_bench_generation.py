"""bench/generation.py on the CPU: the prompts are the same exact-length chat prompts for every arm, a
tiny run measures the plain and engine arms and rates them against the plain baseline, the compiled arm
says why it did not run without CUDA, and bad arguments exit 2."""

from __future__ import annotations

import json

import pytest

from bench import generation


def test_prompts_are_exactly_as_long_as_asked_and_end_at_the_assistant_turn(tokenizer):
    prompts = generation.bench_prompts(tokenizer, 64, 128)
    assert len(prompts) == 64 and {len(p) for p in prompts} == {128}
    assistant = tokenizer.convert_tokens_to_ids("<|assistant|>")
    assert all(p[-1] == assistant for p in prompts)
    assert len({tuple(p) for p in prompts}) == 64
    assert prompts == generation.bench_prompts(tokenizer, 64, 128)


def test_tiny_run_rates_the_engine_against_plain_generate(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    rc = generation.main(["--tiny", "--arms", "plain_dynamic,engine_dynamic,engine_compiled", "--calls", "1"])
    assert rc == 0
    got = json.loads((tmp_path / "generation.json").read_text())
    plain, engine, compiled = got["results"]
    assert got["setup"]["prompts"] == 4 and got["setup"]["max_new_tokens"] == 8
    for r in (plain, engine):
        assert r["samples_per_s"] > 0 and 0 < r["generated_tokens_per_call"] <= 4 * 8
    assert plain["vs_plain_dynamic"] == 1.0
    assert engine["vs_plain_dynamic"] == pytest.approx(engine["samples_per_s"] / plain["samples_per_s"])
    assert engine["engine"]["mode"] == "dynamic"
    assert compiled["error"] == "not run: needs CUDA" and compiled["vs_plain_dynamic"] is None
    assert "| engine_dynamic |" in (tmp_path / "generation.md").read_text()


@pytest.mark.parametrize("argv", [["--arms", "engine_fast"], ["--calls", "0"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        generation.parse_args(argv)
    assert e.value.code == 2 and capsys.readouterr().err
