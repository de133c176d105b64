"""The bundled multiplication task (align/data/synthetic.py; data=mul, data=mul_mix, data=mul_prompts): the
files are the generator's output, every demonstration's call is one the calculator answers with the
demonstrated result, and a demonstration encodes, token for token and mask for mask, as the trajectory a
tool-using GRPO rollout makes of the same turns (align/objectives/multi_turn.py), so SFT on it teaches
exactly what the rollouts sample."""

from __future__ import annotations

import json

from align.config import to_typed
from align.data.encode import encode_one
from align.data.prompts import load_prompts
from align.data.sources import load_records
from align.data.synthetic import BUNDLED_MUL, bundled_mul, mul_records, render
from align.objectives.multi_turn import ToolMessage
from align.rewards import WeightedReward
from align.rewards.tool_calls import ToolBox

CALC = "align.rewards.calculator:calculator"


def _cfg(compose, *overrides):
    return to_typed(compose(["logger=none", "data.max_records=50", *overrides]))


def test_the_bundled_files_are_the_generators_output_and_the_calculator_answers_every_call():
    for split, params in BUNDLED_MUL.items():
        assert bundled_mul(split).read_text() == render(mul_records(**params)), split
    tools = ToolBox.load([CALC])
    for r in map(json.loads, bundled_mul("train").read_text().splitlines()):
        user, call, tool, answer = r["messages"]
        a, b = r["question"].removesuffix("=").split("*")
        assert user["content"] == r["question"] and r["answer"] == str(int(a) * int(b))
        reply = tools.respond(call["content"])
        assert reply.ok and reply.content == tool["content"] == answer["content"] == r["answer"]
        assert (user["role"], call["role"], tool["role"], answer["role"]) == ("user", "assistant", "tool", "assistant")


def test_a_demonstration_encodes_as_the_rollout_of_its_turns(compose, tokenizer):
    tok, eos = tokenizer, tokenizer.eos_token_id
    demos = load_records(_cfg(compose, "data=mul").data)
    prompts_cfg = _cfg(compose, "objective=grpo", "data=mul_prompts")
    prompts = load_prompts(prompts_cfg, tok, WeightedReward(prompts_cfg.reward.weights))
    rows = bundled_mul("train").read_text().splitlines()[:50]
    assert prompts.references == [json.loads(line)["answer"] for line in rows]
    message = ToolMessage(tok)
    for i, record in enumerate(demos):
        _, call, tool, answer = record.messages
        ids, mask = encode_one(tok, record)
        turn1 = tok(call["content"], add_special_tokens=False)["input_ids"] + [eos]
        turn2 = tok(answer["content"], add_special_tokens=False)["input_ids"] + [eos]
        between = message.ids(tool["content"])
        # the prompt GRPO generates from, the model's call, the tool message as the rollout renders it, the answer
        assert ids == prompts.prompt(i) + turn1 + between + turn2
        # loss on the model's turns only, as the rollout's mask: the tool's result is context
        assert mask == [False] * len(prompts.prompt(i)) + [True] * len(turn1) + [False] * len(between) + \
            [True] * len(turn2)


def test_the_mixture_holds_the_demonstrations_and_the_same_questions_answered_at_once(compose):
    records = load_records(_cfg(compose, "data=mul_mix").data)
    calls = [r for r in records if r.root == "calls"]
    head = [r for r in records if r.root == "head"]
    assert len(calls) == len(head) == 50
    for c, h in zip(calls, head):
        assert [m["role"] for m in c.messages] == ["user", "assistant", "tool", "assistant"]
        assert h.messages == [c.messages[0], c.messages[-1]]  # the question, the product at once
