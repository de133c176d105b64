"""Multi-turn tool-using GRPO rollouts (align/objectives/multi_turn.py): a scripted engine that calls the
calculator and then answers gives trajectories whose tokens, loss masks and engine log-probs are exactly
its turns and the tool messages between them; in a trainer, the tool messages' tokens get no gradient
(the test that fails when they enter the loss); and the config refuses what cannot run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from align.data.collate import IGNORE
from align.errors import ConfigError
from align.generation import Completion, FinishReason, SamplingSpec, derive_seed
from align.objectives.multi_turn import MultiTurn, ToolMessage
from align.rewards.tool_calls import CLOSE, OPEN, ToolBox
from align.telemetry.console import metric_fields, watched
from tests.conftest import build_trainer

CALC = "align.rewards.calculator:calculator"
TOOLS = ["objective=grpo", "objective.group_size=4", "objective.prompts_per_rollout=2", "trainer.max_steps=1",
         "trainer.export=false", "trainer.device=cpu", "objective.max_turns=3", f"objective.tools=[{CALC}]",
         "objective.max_new_tokens=64", "data.max_seq_len=256"]


def _call(expression: str) -> str:
    return f"{OPEN}{json.dumps({'name': 'calculator', 'arguments': {'expression': expression}})}{CLOSE}"


class ScriptedEngine:
    """An `Engine` that plays a script instead of sampling. A turn after a tool message answers with the
    tool's result ("0" after an error); otherwise sample k of a prompt "<a>+<b>=" calls the calculator on it
    (k = 0, 1), answers "7" at once (k = 2) or makes a call without its closing tag (k = 3). Every token
    gets its own log-prob, distinct across calls, and the calls are kept."""

    def __init__(self, tok) -> None:
        self.tok, self.calls = tok, []

    def reply(self, prompt: str, k: int) -> str:
        if "<|tool|>" in prompt:
            result = prompt.rpartition("<|tool|>")[2].partition("<|end|>")[0]
            return "0" if result.startswith("error") else result
        question = prompt.rpartition("<|user|>")[2].partition("<|end|>")[0].rstrip("=")
        return [_call(question), _call(question), "7", _call(question)[: -len(CLOSE)]][k % 4]

    def generate(self, prompts, spec: SamplingSpec) -> list[Completion]:
        self.calls.append(([list(p) for p in prompts], spec))
        out = []
        for i, p in enumerate(prompts):
            for k in range(spec.n):
                text = self.reply(self.tok.decode(list(p), skip_special_tokens=False), k)
                ids = tuple(self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
                lp = tuple(-0.001 * (1000 * len(self.calls) + 10 * len(out) + j) for j in range(len(ids)))
                out.append(Completion(i, k, ids, lp, lp, FinishReason.stop))
        return out

    def describe(self) -> dict:
        return {"backend": "scripted"}


def _prompt(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def _multi_turn(tok, max_turns: int = 3, max_len: int = 512) -> MultiTurn:
    return MultiTurn(ToolBox.load([CALC]), ToolMessage(tok), max_turns, max_len,
                     decode=lambda ids: tok.decode(list(ids), skip_special_tokens=True))


def test_a_scripted_rollout_holds_its_turns_and_tool_messages_with_masks_and_log_probs(tokenizer):
    tok = tokenizer
    engine, prompt = ScriptedEngine(tok), _prompt(tok, "12*34=")
    spec = SamplingSpec(max_new_tokens=64, n=3, seed=5)
    out = _multi_turn(tok).run(engine, [prompt], spec)
    call, tool, answer = _ids(tok, _call("12*34")), ToolMessage(tok).ids("408"), _ids(tok, "408")
    assert tok.decode(tool) == "<|tool|>408<|end|><|assistant|>"
    # turn 2 is one engine call over the two trajectories still running, each its own prompt, n=1, its own seed
    assert len(engine.calls) == 2
    (first, s1), (second, s2) = engine.calls
    assert first == [prompt] and s1 == spec
    assert second == [prompt + call + tool] * 2 and s2.n == 1 and s2.seed == derive_seed(5, 1)
    t = out[0]
    assert list(t.body) == call + tool + answer and list(t.token_ids) == answer
    assert list(t.mask) == [True] * len(call) + [False] * len(tool) + [True] * len(answer)
    assert (t.turns, t.tool_calls, t.tool_errors, t.finish_reason) == (2, 1, 0, FinishReason.stop)
    # the model's tokens' log-probs, in order: turn 1's from the first call (its completion 0), turn 2's from
    # the second (its completion 0), as the script numbered them; none for the tool message
    want = [-0.001 * (1000 + j) for j in range(len(call))] + [-0.001 * (2000 + j) for j in range(len(answer))]
    assert t.logprobs == pytest.approx(want) and len(t.logprobs) == sum(t.mask)
    assert t.sampler_logprobs == t.logprobs
    direct = out[2]  # "7" at once: one turn, nothing masked out, no second engine call for it
    assert list(direct.body) == _ids(tok, "7") and all(direct.mask) and direct.turns == 1 and direct.tool_calls == 0
    assert [(o.prompt_index, o.sample_index) for o in out] == [(0, 0), (0, 1), (0, 2)]


def test_a_malformed_call_is_answered_with_an_error_and_the_model_goes_on(tokenizer):
    tok = tokenizer
    out = _multi_turn(tok).run(ScriptedEngine(tok), [_prompt(tok, "1+2=")], SamplingSpec(max_new_tokens=64, n=4))
    bad = out[3]
    text = tok.decode(list(bad.body))
    assert "<|tool|>error: the tool call has no closing </tool_call><|end|>" in text
    assert (bad.turns, bad.tool_calls, bad.tool_errors) == (2, 1, 1) and list(bad.token_ids) == _ids(tok, "0")


def test_turns_and_length_bound_a_trajectory(tokenizer):
    tok = tokenizer
    prompt = _prompt(tok, "1+2=")
    one = _multi_turn(tok, max_turns=1).run(ScriptedEngine(tok), [prompt], SamplingSpec(max_new_tokens=64))[0]
    assert one.turns == 1 and one.tool_calls == 0 and all(one.mask)  # the call is its last turn, unanswered
    room = len(prompt) + len(_ids(tok, _call("1+2"))) + 64  # no room for the tool message and another turn
    cut = _multi_turn(tok, max_len=room).run(ScriptedEngine(tok), [prompt], SamplingSpec(max_new_tokens=64))[0]
    assert cut.finish_reason == FinishReason.length and list(cut.body) == _ids(tok, _call("1+2")) and all(cut.mask)


# ------------------------------------------------------------------------ in a trainer (tiny model, CPU)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    trainer = build_trainer(tmp_path_factory.mktemp("grpo_tools"), *TOOLS)
    trainer.objective.engine = ScriptedEngine(trainer.tokenizer)
    metrics, _ = trainer.train_step(iter(trainer.stream))
    return trainer, metrics


def test_the_rollout_is_its_trajectories_model_tokens_in_the_loss(scripted):
    trainer, row = scripted
    r, tok = trainer.objective.rollout, trainer.tokenizer
    assert r.loss_mask is not None and r.size == 8
    for s in range(r.size):
        a, b = r.offsets[s], r.offsets[s + 1]
        mask = r.loss_mask[a:b]
        assert not mask[:r.prompt_lens[s]].any() and mask[-1]  # the prompt is out, the last turn in
        held_out = tok.decode(r.tokens[a:b][~mask][r.prompt_lens[s]:].tolist())  # what is out after the prompt
        assert held_out == "" or (held_out.startswith("<|tool|>") and held_out.endswith("<|end|><|assistant|>"))
    assert len(r.engine_logps) == r.loss_mask.sum() == row["rollout/tokens"] == row["loss_tokens"]
    assert row["rollout/turns_mean"] == pytest.approx(7 / 4) and row["rollout/tool_calls_mean"] == pytest.approx(3 / 4)
    assert row["rollout/tool_error_frac"] == pytest.approx(1 / 3)
    # the reward read each trajectory's last turn: the calculator's sums are right; "7" and the "0" answering
    # the error only where the reference is that
    refs = [trainer.objective.prompts.references[i] for i in r.rows]
    want = [k < 2 or (k == 2 and ref == "7") or (k == 3 and ref == "0") for k, ref in zip(np.arange(8) % 4, refs)]
    assert [bool(x) for x in r.rewards] == want
    assert trainer.model_info["loss"]["sampling"]["tools"][0]["function"] == CALC
    # the progress line and the end summary show the calls beside the reward
    assert metric_fields(watched(trainer.objective), row).endswith(" tool calls 0.7500")


def test_tool_tokens_get_no_gradient_and_the_models_tokens_do(scripted):
    """The loss path as a step runs it (micro_loss over a collated micro-batch): the hidden state at each
    position that predicts a tool-message token has zero gradient, so changing that token's log-prob changes
    nothing; every position that predicts a model token has some. Fails when tool tokens enter the loss."""
    trainer, _ = scripted
    obj, r = trainer.objective, trainer.objective.rollout
    seqs = np.arange(r.size)
    batch = obj._batch(seqs, with_old=False)
    kept = []

    def spy(*args, **kwargs):
        out = trainer.forward(*args, **kwargs)
        out.retain_grad()
        kept.append(out)
        return out

    obj.micro_loss(spy, batch).backward()
    grad = kept[0].grad.abs().sum(-1)  # [B, L]: the loss's gradient at each position's hidden state
    trainer.model.zero_grad(set_to_none=True)
    tool_positions = model_positions = 0
    for b, s in enumerate(seqs):
        a, e = r.offsets[s], r.offsets[s + 1]
        mask = r.loss_mask[a:e]
        for p in range(r.prompt_lens[s], e - a):  # position p - 1 predicts token p
            if mask[p]:
                assert grad[b, p - 1] > 0 and batch.labels[b, p - 1] == r.tokens[a + p]
                model_positions += 1
            else:
                assert grad[b, p - 1] == 0 and batch.labels[b, p - 1] == IGNORE
                tool_positions += 1
    assert tool_positions > 0 and model_positions == batch.loss_tokens == len(batch.engine_logps)
    # the engine's log-probs ride with their own tokens: the script's per-call values, in trajectory order
    torch.testing.assert_close(batch.engine_logps, torch.from_numpy(r.engine_logps))


def test_the_buffer_keeps_the_loss_mask_through_a_checkpoint(scripted):
    from align.objectives.rollout import Rollout

    r = scripted[0].objective.rollout
    back = Rollout.from_state_dict(json.loads(json.dumps(r.state_dict())))
    assert np.array_equal(back.loss_mask, r.loss_mask) and np.array_equal(back.loss_lens, r.loss_lens)


# ----------------------------------------------------------------------------------- config refusals


@pytest.mark.parametrize("overrides,key,says", [
    (["objective.max_turns=0"], "objective.max_turns", "must be an int >= 1"),
    (["objective.max_turns=2"], "objective.max_turns", "above 1 needs objective.tools"),
    ([f"objective.tools=[{CALC}]"], "objective.tools", "is read only when objective.max_turns > 1"),
    (["objective.max_turns=2", "objective.tools=[calculator]"], "objective.tools[0]", "must name a function as"),
])
def test_the_config_refuses_turns_and_tools_that_cannot_run(compose, overrides, key, says):
    from align.config import to_typed

    with pytest.raises(ConfigError, match=says) as e:
        to_typed(compose(["objective=grpo", *overrides]))
    assert e.value.key == key


def test_preflight_refuses_a_tool_that_does_not_import(compose):
    from align.config import to_typed
    from align.run.preflight_checks import run_preflight

    cfg = to_typed(compose(["objective=grpo", "logger=none", "objective.max_turns=2",
                            "objective.tools=[align.rewards.nope:calc]"]))
    with pytest.raises(ConfigError, match="cannot import align.rewards.nope") as e:
        run_preflight(cfg)
    assert e.value.key == "objective.tools[0]"


def test_inspect_shows_a_recorded_trajectory_with_its_turns_in_the_loss(scripted, tmp_path):
    """`align.tools.inspect rollout=<checkpoint dir> index=N`: the rank's recorded rollout (what the checkpoint
    keeps: `rank_state_dict`), the trajectory's turns between the loss marks, its tool message outside them."""
    import re

    from align.tools.inspect import OPEN, Options, inspect_record, segments

    trainer, _ = scripted
    r, tok = trainer.objective.rollout, trainer.tokenizer
    (tmp_path / "rank0.json").write_text(json.dumps({"objective": trainer.objective.rank_state_dict()}))
    out = inspect_record(trainer.cfg, Options(index=0, rollout=str(tmp_path)))
    ids, mask = r.tokens[r.offsets[0]:r.offsets[1]].tolist(), r.loss_mask[r.offsets[0]:r.offsets[1]].tolist()
    body = out.split("-" * 100)[1]
    assert re.findall(r"\[\[(.*?)\]\]", body, re.S) == [tok.decode(run) for m, run in segments(ids, mask) if m]
    assert len(re.findall(re.escape(OPEN), body)) == 2 and "]]<|tool|>" in body  # two turns, the tool message out
    assert out.startswith(f"sequence 0 of rollout 0 (8 sequences, {tmp_path / 'rank0.json'})")
    assert f"{sum(mask)} in the loss" in out and "2 turns of the model" in out
    with pytest.raises(IndexError, match="rollout 0 in .* has 8 sequences; accepted: 0..7"):
        inspect_record(trainer.cfg, Options(index=8, rollout=str(tmp_path)))
