"""A rollout: one generation round's completions on this rank, scored, with their advantages, cut into
the micro-batches of the optimizer steps that replay it.

Sequence s of a rollout is prompt `rows[s]` (a row of the prompt data) followed by its completion, or by
a multi-turn trajectory whose tool messages are holes in the loss mask (`loss_mask`; the completion
tokens below are then the model's own tokens only).
Each optimizer step replays a part of it: `cut` makes `trainer.grad_accum` micro-batches of about as many
sequences (sampler=shuffle), `cut_budget` micro-batches of length-sorted neighbours within
`sampler.max_tokens` (sampler=budget), as many on every rank. The loss is a sum over whole sequences per
micro-batch divided by the step's global unit count, so no cut changes the step's gradient.
The micro-batches are collated by align/data/collate.py from an `EncodedDataset` of the rollout whose
loss tokens are the completion tokens, so packing (`sampler.packed`: one row, positions restart per
sequence, no mask, no cache) and padding behave exactly as for SFT and never attend across sequences.
Flattened in order, a micro-batch's target positions are its sequences' completion tokens, sequence by
sequence: `RolloutBatch` carries the per-target rollout log-probs in that order.

`state_dict` holds everything needed to replay the rest of a rollout after a resume (tokens, log-probs,
rewards, advantages, how many parts were served), as base64 arrays: the weights it was generated with
are gone once an update has run, so it cannot be regenerated.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

from align.config import SamplerConfig, SamplerKind
from align.data.collate import IGNORE, Batch, collate
from align.data.encode import EncodedDataset
from align.data.samplers import batch_shapes, budget_cut


@dataclass
class RolloutBatch(Batch):
    """A training micro-batch of whole completions of one rollout (`Batch` plus what the policy loss reads)."""

    seq_ids: Optional[torch.Tensor] = None
    """[B, L] index (within this micro-batch) of the sequence each target position belongs to; -1: none."""
    seq_index: Optional[np.ndarray] = None
    """[n_seq] the sequences' indices in the rollout."""
    advantages: Optional[torch.Tensor] = None
    """[n_seq] float32."""
    engine_logps: Optional[torch.Tensor] = None
    """[targets] the engine's log-prob of each completion token (tempered, float32)."""
    sampler_logps: Optional[torch.Tensor] = None
    """[targets] the log-prob under the distribution the engine drew from (after top-p; float32)."""
    gen_topk: Optional[torch.Tensor] = None
    """[MoE layers, targets, k] the experts the generation's routers picked for each target's position."""
    old_logps: Optional[torch.Tensor] = None
    """[targets] the trainer's recomputation before the rollout's first update; None when that update is
    this micro-batch's own (one update per rollout): the loss then takes its own detached log-probs."""

    @property
    def n_seq(self) -> int:
        return len(self.seq_index)

    def target_seq(self) -> torch.Tensor:
        """[targets] the sequence (within the micro-batch) of each target, in flattened order."""
        s = self.seq_ids.reshape(-1)
        return s[s >= 0]

    def to(self, device: torch.device) -> "RolloutBatch":
        super().to(device)
        for name in ("seq_ids", "advantages", "engine_logps", "sampler_logps", "old_logps", "gen_topk"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.to(device, non_blocking=device.type == "cuda"))
        return self


def _b64(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    return {"dtype": str(a.dtype), "data": base64.b64encode(a.tobytes()).decode()}


def _unb64(d: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["data"]), dtype=np.dtype(d["dtype"])).copy()


def split_to(batches: list[np.ndarray], count: int, lengths: np.ndarray, pad_to_multiple_of: int = 1,
             packed: bool = False) -> list[np.ndarray]:
    """`batches` as `count` micro-batches: the one computing the most tokens (of those holding more than
    one row) is halved, in order, until there are `count`. Halves of a budget micro-batch fit the
    budget; no micro-batch comes out empty (a count above the rows is refused)."""
    out = list(batches)
    if count > sum(len(b) for b in out):
        raise ValueError(f"{count} micro-batches cannot be cut from {sum(len(b) for b in out)} rows")
    while len(out) < count:
        computed, _ = batch_shapes(out, lengths, pad_to_multiple_of, packed)
        computed[[len(b) < 2 for b in out]] = -1
        i = int(np.argmax(computed))
        half = (len(out[i]) + 1) // 2
        out[i:i + 1] = [out[i][:half], out[i][half:]]
    return out


@dataclass
class Rollout:
    index: int
    """Which rollout of the run this is (0-based); its sampling seed derives from it."""
    rows: np.ndarray
    """[S] int64: each sequence's prompt row."""
    group: np.ndarray
    """[S] int64: each sequence's group (prompt within the rollout)."""
    prompt_lens: np.ndarray
    """[S] int64."""
    tokens: np.ndarray
    """int32, prompt + completion of every sequence, concatenated."""
    offsets: np.ndarray
    """[S + 1] int64 into `tokens`."""
    engine_logps: np.ndarray
    """float32, every completion token's engine log-prob (tempered), concatenated in sequence order."""
    sampler_logps: np.ndarray
    """float32 like `engine_logps`: under the distribution actually sampled (temperature and top-p)."""
    rewards: np.ndarray
    """[S] float64."""
    advantages: np.ndarray
    """[S] float64."""
    stopped: np.ndarray
    """[S] bool: the completion ended on a stop token (else it ran to max_new_tokens)."""
    parts: list[list[np.ndarray]] = field(default_factory=list)
    """Per optimizer step, per micro-batch: the sequence indices it holds."""
    served: int = 0
    """Parts already handed to the trainer."""
    old_logps: Optional[np.ndarray] = None
    """float32 like `engine_logps`: the trainer's recomputation (only when several updates replay it)."""
    router_topk: Optional[torch.Tensor] = None
    """[MoE layers, completion tokens, k] the generation's expert picks; read by the rollout's first
    training forward only, so not checkpointed (no checkpoint falls between generation and that forward)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """What the rollout record shows (weights hash, generation seconds, ...): JSON values."""
    loss_mask: Optional[np.ndarray] = None
    """bool like `tokens`: the tokens the model generated, the only ones in the loss. None: every token after
    the prompt (single-turn). A multi-turn trajectory's tool messages sit between its turns, holes in the
    mask (align/objectives/multi_turn.py); `engine_logps` and the rest hold one value per masked token."""

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def completion_lens(self) -> np.ndarray:
        return np.diff(self.offsets) - self.prompt_lens

    @property
    def loss_lens(self) -> np.ndarray:
        """[S] each sequence's tokens in the loss (generated by the model)."""
        if self.loss_mask is None:
            return self.completion_lens
        return np.add.reduceat(self.loss_mask.astype(np.int64), self.offsets[:-1])

    def completion_offsets(self) -> np.ndarray:
        """[S + 1] into `engine_logps` (and every per-loss-token array): each sequence's loss tokens."""
        return np.concatenate([[0], np.cumsum(self.loss_lens)]).astype(np.int64)

    def dataset(self) -> EncodedDataset:
        """The rollout as an EncodedDataset whose loss tokens are the generated tokens (`loss_mask`)."""
        if self.loss_mask is not None:
            mask = self.loss_mask.astype(bool)
        else:
            mask = np.zeros(len(self.tokens), dtype=bool)
            for s in range(self.size):
                mask[self.offsets[s] + self.prompt_lens[s]: self.offsets[s + 1]] = True
        n = self.size
        return EncodedDataset(tokens=self.tokens, loss_mask=mask, offsets=self.offsets, ids=[str(i) for i in range(n)],
                              roots=["rollout"] * n)

    def cut(self, updates: int, micro: int) -> None:
        """Split the rollout into `updates` parts of `micro` micro-batches each, in sequence order (a
        group's completions are consecutive), every micro-batch holding about as many sequences."""
        order = np.arange(self.size)
        steps = np.array_split(order, updates)
        self.parts = [np.array_split(step, micro) for step in steps]

    def cut_budget(self, updates: int, sampler: SamplerConfig,
                   agree: Callable[[list[int]], list[int]] = lambda counts: counts) -> None:
        """Split the rollout into `updates` parts in sequence order (as `cut`), then each part, sorted by
        length so that neighbours share a padded length, into micro-batches within `sampler.max_tokens`
        (the budget sampler's own cut). `agree` maps this rank's micro-batch count per part to the count
        every rank runs (the max over ranks: under FSDP every forward is collective); a part with fewer
        is evened out by halving its largest micro-batches."""
        lengths = np.diff(self.offsets)
        mult, packed = sampler.pad_to_multiple_of, sampler.packed
        parts = []
        for step in np.array_split(np.arange(self.size), updates):
            ordered = step[np.argsort(lengths[step], kind="stable")]
            parts.append(budget_cut(ordered, lengths, sampler.max_tokens, mult, packed))
        counts = agree([len(p) for p in parts])
        self.parts = [split_to(p, int(c), lengths, mult, packed) for p, c in zip(parts, counts)]

    def misfit(self, part: list[np.ndarray], micro: int, sampler: SamplerConfig) -> Optional[str]:
        """Why the trainer cannot take `part` as cut (a config changed mid-rollout), or None."""
        if sampler.kind != SamplerKind.budget:
            if len(part) == micro:
                return None
            return (f"cut into {len(part)} micro-batches per step, the trainer asks for {micro}: "
                    "trainer.grad_accum changed mid-rollout")
        computed, _ = batch_shapes(part, np.diff(self.offsets), sampler.pad_to_multiple_of, sampler.packed)
        if computed.max() <= sampler.max_tokens:
            return None
        return (f"has a micro-batch of {int(computed.max())} tokens, over sampler.max_tokens={sampler.max_tokens}: "
                "the sampler changed mid-rollout")

    def batch(self, seqs: np.ndarray, pad_id: int, pad_to_multiple_of: int, packed: bool, mask_padding: bool,
              with_old: bool, data: Optional[EncodedDataset] = None) -> RolloutBatch:
        data = data if data is not None else self.dataset()
        b = collate(data, seqs, pad_id, pad_to_multiple_of, packed, mask_padding)
        lens = self.loss_lens[seqs]
        seq_ids = np.full(b.labels.shape, -1, dtype=np.int64)
        keep = b.labels.numpy() != IGNORE
        seq_ids[keep] = np.repeat(np.arange(len(seqs)), lens)
        coff = self.completion_offsets()
        take = np.concatenate([np.arange(coff[s], coff[s + 1]) for s in seqs])
        old = None
        if with_old:
            assert self.old_logps is not None, "the rollout's old log-probs are recomputed before it is served"
            old = torch.from_numpy(self.old_logps[take])
        fields_ = {k: getattr(b, k) for k in ("input_ids", "labels", "attention_mask", "tokens", "real_tokens",
                                              "loss_tokens", "position_ids", "padding_mask")}
        return RolloutBatch(**fields_, rows=self.rows[seqs], seq_ids=torch.from_numpy(seq_ids),
                            seq_index=np.asarray(seqs), advantages=torch.from_numpy(self.advantages[seqs]).float(),
                            engine_logps=torch.from_numpy(self.engine_logps[take]),
                            sampler_logps=torch.from_numpy(self.sampler_logps[take]), old_logps=old,
                            gen_topk=None if self.router_topk is None else self.router_topk[:, torch.from_numpy(take)])

    # ------------------------------------------------------------------------------ checkpoints

    _ARRAYS = ("rows", "group", "prompt_lens", "tokens", "offsets", "engine_logps", "sampler_logps", "rewards",
               "advantages", "stopped")

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "served": self.served, "meta": self.meta,
                               "parts": [[p.tolist() for p in step] for step in self.parts]}
        out.update({k: _b64(getattr(self, k)) for k in self._ARRAYS})
        out["old_logps"] = None if self.old_logps is None else _b64(self.old_logps)
        out["loss_mask"] = None if self.loss_mask is None else _b64(self.loss_mask)
        return out

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> "Rollout":
        arrays = {k: _unb64(d[k]) for k in cls._ARRAYS}
        parts = [[np.asarray(p, dtype=np.int64) for p in step] for step in d["parts"]]
        old = None if d["old_logps"] is None else _unb64(d["old_logps"])
        mask = None if d.get("loss_mask") is None else _unb64(d["loss_mask"])
        return cls(index=int(d["index"]), parts=parts, served=int(d["served"]), old_logps=old, meta=dict(d["meta"]),
                   loss_mask=mask, **arrays)
