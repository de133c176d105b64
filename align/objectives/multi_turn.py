"""GRPO's multi-turn rollouts (`objective.max_turns` > 1 with `objective.tools`; docs/grpo.md#tools): a
trajectory is a conversation in which the model's turn may call a tool (align/rewards/tool_calls.py).

Turn 1 is the single-turn call: the prompts, `group_size` completions each, the rollout's seed. After each
turn, a trajectory whose turn ended on a stop token and called a tool gets the tool's answer as a `tool`
message, rendered through the chat template with the next assistant prompt after it (`ToolMessage`), and
takes another turn; every later turn is ONE engine call over the trajectories still running (each its own
prompt: everything so far, token for token), seeded from the rollout's seed and the turn. A trajectory
ends on a turn that calls no tool, at `max_turns`, on a turn cut by `max_new_tokens`, or where another
turn would not fit `data.max_seq_len` (then without the tool message: a trajectory ends on the model's
tokens).

A trajectory is one sequence: the prompt, then its turns and tool messages as they came. Its mask marks
the model's own generated tokens (1); the prompt's, the tool messages' and the template's tokens between
them are 0, so nothing the model did not sample enters the loss, the log-prob comparison or the
importance ratio. `logprobs` and `sampler_logprobs` are the engine's, one per masked token, in order,
exactly as a single-turn completion's, and so is the routing an engine records (`router_topk`, MoE: GRPO's
router flip record). The reward scores the last turn's text (`token_ids`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from align.errors import ConfigError
from align.generation.engine import Completion, FinishReason, SamplingSpec, derive_seed
from align.rewards.tool_calls import KEY, ToolBox


@dataclass(frozen=True)
class Trajectory:
    """One finished trajectory; `prompt_index`, `sample_index`, `token_ids` and `finish_reason` read as a
    `Completion`'s, so the reward scores it as one."""

    prompt_index: int
    sample_index: int
    token_ids: tuple[int, ...]
    """The last turn's tokens: what the reward scores."""
    body: tuple[int, ...]
    """Every token after the prompt: turns and tool messages."""
    mask: tuple[bool, ...]
    """Per token of `body`: the model generated it (in the loss)."""
    logprobs: tuple[float, ...]
    """Per masked token: the engine's log softmax(logits / T) (align/generation/engine.py)."""
    sampler_logprobs: tuple[float, ...]
    finish_reason: FinishReason
    turns: int
    tool_calls: int
    tool_errors: int
    router_topk: Any = field(default=None, compare=False)
    """MoE, where the engine records routing: [MoE layers, masked tokens, k], its turns' `Completion.router_topk`
    end to end (the tool messages, which no router of the rollout saw, have none); None where a turn has none."""

    @property
    def num_tokens(self) -> int:
        return len(self.body)


class ToolMessage:
    """The tokens between a turn that called a tool and the model's next turn: the tool message rendered by
    the chat template, then its generation prompt. Read as the difference between the template's rendering
    of a conversation with and without a trailing tool message, so any template that renders a `tool`
    role works (the bundled one renders `<|tool|>result<|end|><|assistant|>`); one that cannot is refused
    (one line naming objective.tools, exit 2) when the objective is built."""

    BASE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        try:
            self.prefix = tokenizer.apply_chat_template(self.BASE, tokenize=False)
            probe = self._render("r")
        except Exception as e:  # a template that raises on a role it does not know
            why = f"{type(e).__name__}: {e}"
            raise ConfigError(KEY, f"the chat template cannot render a tool message ({why})") from None
        if not probe.startswith(self.prefix) or "r" not in probe[len(self.prefix):]:
            raise ConfigError(KEY, "the chat template does not render a tool message after an assistant turn as a "
                              "suffix of the conversation; tools need one that does")

    def _render(self, content: str) -> str:
        return self.tok.apply_chat_template(self.BASE + [{"role": "tool", "content": content}], tokenize=False,
                                            add_generation_prompt=True)

    def ids(self, content: str) -> list[int]:
        return self.tok(self._render(content)[len(self.prefix):], add_special_tokens=False)["input_ids"]


@dataclass
class _Running:
    prompt_index: int
    sample_index: int
    body: list[int] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampler_logprobs: list[float] = field(default_factory=list)
    last: tuple[int, ...] = ()
    finish: FinishReason = FinishReason.stop
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    routed: list[Any] = field(default_factory=list)

    def add_turn(self, c: Completion) -> None:
        self.body += c.token_ids
        self.mask += [True] * c.num_tokens
        self.logprobs += c.logprobs
        self.sampler_logprobs += c.sampler_logprobs
        self.routed.append(c.router_topk)
        self.last, self.finish, self.turns = tuple(c.token_ids), c.finish_reason, self.turns + 1

    def done(self) -> Trajectory:
        import torch

        routed = None if any(r is None for r in self.routed) else torch.cat(self.routed, dim=1)
        return Trajectory(self.prompt_index, self.sample_index, self.last, tuple(self.body), tuple(self.mask),
                          tuple(self.logprobs), tuple(self.sampler_logprobs), self.finish, self.turns,
                          self.tool_calls, self.tool_errors, routed)


@dataclass
class MultiTurn:
    """Runs a rollout's trajectories: `max_turns` turns at most, each one engine call."""

    tools: ToolBox
    message: ToolMessage
    max_turns: int
    max_len: int
    """`data.max_seq_len`: no trajectory grows past it."""
    decode: Callable[[Sequence[int]], str]
    """A turn's token ids as the text the tool call is read from (special tokens dropped)."""

    def run(self, engine: Any, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Trajectory]:
        """`spec.n` trajectories per prompt, ordered by (prompt_index, sample_index) like `Engine.generate`."""
        out = engine.generate(prompts, spec)
        states = [_Running(c.prompt_index, c.sample_index) for c in out]
        active = list(range(len(states)))
        for turn in range(1, self.max_turns + 1):
            more, inputs = [], []
            for i, c in zip(active, out):
                s = states[i]
                s.add_turn(c)
                if turn == self.max_turns or c.finish_reason != FinishReason.stop:
                    continue
                reply = self.tools.respond(self.decode(c.token_ids))
                if reply is None:
                    continue
                s.tool_calls += 1
                s.tool_errors += not reply.ok
                ids = self.message.ids(reply.content)
                prompt = prompts[s.prompt_index]
                if len(prompt) + len(s.body) + len(ids) + spec.max_new_tokens > self.max_len:
                    s.finish = FinishReason.length  # no room for another turn
                    continue
                s.body += ids
                s.mask += [False] * len(ids)
                more.append(i)
                inputs.append(list(prompt) + s.body)
            if not more:
                break
            out = engine.generate(inputs, dataclasses.replace(spec, n=1, seed=derive_seed(spec.seed, turn)))
            active = more
        return [s.done() for s in states]


def build_multi_turn(cfg: Any, tokenizer: Any) -> MultiTurn:
    """The run's `MultiTurn`: its tools loaded (preflight imported them first), its template checked."""
    return MultiTurn(tools=ToolBox.load(cfg.objective.tools), message=ToolMessage(tokenizer),
                     max_turns=cfg.objective.max_turns, max_len=cfg.data.max_seq_len,
                     decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True))
