"""align's own decode engine over transformers' model classes (`Backend.align`).

The life of a call:

1. Every (prompt, sample) row gets a key (`derive_seed(seed, prompt, sample)`): its draws are a hash of
   that key and the step (align/generation/device_sampling.py), whatever slot or batch it runs in.
2. Waiting prompts are admitted while `n` slots are free: one prefill forward over the admitted prompts
   (left-padded to a multiple of `pad_to_multiple_of`, transformers' own modules under align's attention
   function) writes each prompt's keys into all `n` of its slots and samples each row's first token.
3. Decode steps feed every live slot's last token at its own position; the attention reads each slot's
   live keys only (align/generation/slot_attention.py). On CUDA each step is one replay of a CUDA graph
   captured per bucket of live rows (powers of two up to the slot count) and sampling law.
4. Every `sync_every` steps the host reads which rows have stopped (a stop token, or `max_new_tokens`),
   copies their tokens and log-probs out, frees their slots, and admits waiting prompts into them
   (continuous batching): ragged completion lengths do not leave the batch half empty.
5. Where asked (`record_routers`: GRPO's router flip record of a MoE policy), each step also writes, beside
   each row's token, the experts every router picked at the position that predicted it; a completion
   carries them out (`Completion.router_topk`).

Rows that stopped between two looks keep being fed (their writes land where they already were and their
outputs in a spare column) until the host frees them; nothing they compute is returned.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Any, Iterator, Optional, Sequence

import torch
import transformers

from align.errors import ConfigError
from align.generation import device_sampling
from align.generation.device_sampling import Law
from align.generation.engine import (
    SLOT_POSITIONS_MULTIPLE,
    Backend,
    Completion,
    EngineConfig,
    FinishReason,
    GenerateMode,
    SamplingSpec,
    derive_seed,
    resolve_mode,
)
from align.generation.routing import Routing
from align.generation.slot_attention import ALIGN_SLOTS, prepare, reading, register, varlen_usable
from align.generation.slots import SlotCache, StepRows, layer_geometry
from align.generation.weights import ModelWeights

_DIRECT = {"backend_requested": "align", "backend_reason": "built directly"}


class AlignEngine(ModelWeights):
    """`Engine` on align's decode loop. Built on the training model it shares its weights; `copy_of` builds
    one on a copy (e.g. in another dtype), kept current by `sync_from`."""

    backend = Backend.align

    def __init__(self, model: torch.nn.Module, cfg: EngineConfig, *, pad_token_id: int,
                 eos_token_ids: Sequence[int], shares_weights: bool = True) -> None:
        self.model, self.cfg, self.shares_weights = model, cfg, shares_weights
        self.device = next(model.parameters()).device
        if self.device.type not in ("cpu", "cuda"):
            raise ConfigError("generation.backend", f"the align engine runs on cpu or cuda, not {self.device.type}")
        self.mode = resolve_mode(cfg.mode, self.device.type)
        self.graphs = self.mode is GenerateMode.compiled
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.num_slots = cfg.batch_size
        self._state: Optional[_State] = None
        self._graphs: dict[tuple, Any] = {}
        self._pool = None
        self.graph_failure: Optional[str] = None
        self.compile_failure: Optional[str] = None
        self.graph_break: Optional[str] = None
        self._broke = False
        self._compiled: Optional[tuple] = None
        self._reserved = (0, 0)
        self.last_call: dict[str, Any] = {}
        self._routing: Optional[Routing] = None
        register()
        prepare(self.device)
        dtype = next(model.parameters()).dtype
        self.packed_prefill = all(varlen_usable(dtype, self.device, d) for _, d in _kv_shapes(model).values())
        """Prefill the admitted prompts end to end in one row (no padding) where every layer's attention
        can run packed at speed (align/generation/slot_attention.py); else left-padded."""

    def record_routers(self, taps: Sequence[Any]) -> None:
        """Record, per generated token, the experts each MoE router of `taps` picked (align/models/family_table.py
        `RouterTap`s of this engine's model, in the order the trainer's record reads them): every Completion
        then carries `router_topk`. The prefill keeps each prompt's last position (it predicts token 0), a
        decode step its rows' one position, written on the device beside the token, so the record rides in the
        captured steps and through continuous batching."""
        self._routing = Routing(taps)
        self._graphs.clear()
        self._state = self._compiled = None

    # ---------------------------------------------------------------------------------------- calls

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> list[Completion]:
        self._check(prompts, spec)
        stops = self.eos_token_ids if spec.stop_token_ids is None else spec.stop_token_ids
        max_len = max(len(p) for p in prompts) + spec.max_new_tokens
        state = self._state_for(max_len, spec.max_new_tokens)
        state.set_call(spec, stops)
        law = Law(greedy=spec.greedy, truncated=spec.top_k > 0 or spec.top_p < 1)
        out: dict[tuple[int, int], Completion] = {}
        waiting, free, live = deque(range(len(prompts))), list(range(self.num_slots - 1, -1, -1)), {}
        steps = syncs = 0
        # The loop never wants dynamo: blocks compiled for training would recompile for the decode shapes.
        routers = self._routing.hooks() if self._routing else contextlib.nullcontext()
        with _decoding(self.model), reading(state.cache), routers, torch.no_grad(), \
                torch.compiler.set_stance("force_eager"):
            while waiting or live:
                admitted = []
                while waiting and len(free) >= spec.n:
                    p = waiting.popleft()
                    admitted.append((p, [free.pop() for _ in range(spec.n)]))
                if admitted:
                    self._prefill(state, [prompts[p] for p, _ in admitted], admitted, spec, law)
                    for p, slots in admitted:
                        live.update({slot: (p, s) for s, slot in enumerate(slots)})
                rows = sorted(live)
                bucket = self._set_rows(state, rows)
                for _ in range(self.cfg.sync_every):
                    self._step(state, bucket, law)
                    steps += 1
                syncs += 1
                done = [slot for slot, on in zip(rows, state.active[rows].tolist()) if not on]
                for slot, completion in zip(done, state.harvest(done, [live.pop(x) for x in done], stops,
                                                                spec.max_new_tokens)):
                    out[(completion.prompt_index, completion.sample_index)] = completion
                    free.append(slot)
        self.last_call = {"decode_steps": steps, "host_syncs": syncs, "rows": len(out)}
        return [out[(p, s)] for p in range(len(prompts)) for s in range(spec.n)]

    def _check(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec) -> None:
        self.check_prompts(prompts)
        if spec.n > self.num_slots:
            raise ConfigError("generation.batch_size", f"the align engine admits a prompt's {spec.n} samples "
                              f"together: batch_size (its slots) must be >= sampling.n", self.num_slots)

    # --------------------------------------------------------------------------------- the forwards

    def _prefill(self, state: "_State", prompts, admitted, spec: SamplingSpec, law: Law) -> None:
        fanout = torch.tensor([slots for _, slots in admitted], dtype=torch.long)
        keys = torch.tensor([[derive_seed(spec.seed, p, s) for s in range(spec.n)] for p, _ in admitted])
        fanout, keys = fanout.to(self.device), keys.to(self.device)
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        if self.packed_prefill:
            ids = torch.cat([torch.as_tensor(p, dtype=torch.long) for p in prompts])[None]
            positions = torch.cat([torch.arange(n) for n in lengths.tolist()])[None]
            cu = torch.zeros(len(prompts) + 1, dtype=torch.int32)
            cu[1:] = lengths.cumsum(0)
            doc = torch.repeat_interleave(torch.arange(len(prompts)), lengths)
            ids, positions, cu, doc = (t.to(self.device) for t in (ids, positions, cu, doc))
            state.cache.rows = StepRows(slots=fanout[:, 0], positions=positions, prefill=True, fanout=fanout, cu=cu,
                                        doc=doc, longest=int(lengths.max()))
            last = (cu[1:] - 1).long()  # each prompt's last column: its next-token logits
            logits = self.model(input_ids=ids, position_ids=positions, cache=state.cache, use_cache=True,
                                logits_to_keep=last).logits[0].float()
            experts = state.routed(lambda ids: ids[last])
        else:
            multiple = self.cfg.pad_to_multiple_of
            width = -(-int(lengths.max()) // multiple) * multiple
            ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
            for row, p in enumerate(prompts):
                ids[row, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
            pad = (width - lengths).to(self.device)
            ids = ids.to(self.device)
            positions = (torch.arange(width, device=self.device)[None, :] - pad[:, None]).clamp(min=0)
            state.cache.rows = StepRows(slots=fanout[:, 0], positions=positions, prefill=True, pad=pad, fanout=fanout)
            # The last column as a tensor, not `1`: given an int, Gemma-4 feeds its KV-sharing layers the last
            # column alone, whose query the mask here (built for the full width) would let read the padding.
            last = torch.tensor([width - 1], device=self.device)
            logits = self.model(input_ids=ids, position_ids=positions, cache=state.cache, use_cache=True,
                                logits_to_keep=last).logits[:, -1].float()
            experts = state.routed(lambda ids: ids.reshape(len(prompts), width, -1)[:, -1])
        n = spec.n
        state.start(fanout.flatten(), keys.flatten(), logits.repeat_interleave(n, 0), lengths.to(self.device), law,
                    None if experts is None else experts.repeat_interleave(n, 0))

    def _set_rows(self, state: "_State", rows: list[int]) -> int:
        """Put the live slots in the smallest bucket that holds them (the spare fills the rest)."""
        bucket = _bucket(len(rows), self.num_slots)
        state.rows[bucket].copy_(torch.tensor(rows + [state.scratch] * (bucket - len(rows))))
        return bucket

    def _step(self, state: "_State", bucket: int, law: Law) -> None:
        if not self.graphs:
            return state.decode(self.model, bucket, law)
        graph = self._graph(state, bucket, law)
        if graph is None:
            return state.decode(self.model, bucket, law)
        graph.replay()

    def _graph(self, state: "_State", bucket: int, law: Law):
        key = (id(state), bucket, law, state.stops.numel())
        if key in self._graphs:
            return self._graphs[key]
        if self.graph_failure is not None:
            return None
        saved = state.rows[bucket].clone()
        state.rows[bucket].fill_(state.scratch)  # capture on the spare slot: live rows do not advance
        fn = self._step_fn(state, bucket)
        graph = self._capture(state, fn, bucket, law)
        if graph is None and fn is not state.decode and self.graph_break is None and self._broke:
            # One graph broke in two: the step compiles in pieces, and a piece that sits inside a layer
            # recompiles for each layer (its module's `layer_idx` is a guarded constant) until dynamo's
            # recompile limit leaves the rest eager. Said in describe(), then compiled in pieces anyway.
            self.graph_break, self.compile_failure, self._compiled = self.compile_failure, None, None
            fn = self._step_fn(state, bucket)
            graph = self._capture(state, fn, bucket, law)
        if graph is None and fn is not state.decode:  # the compiled step failed: the eager step's graph
            graph = self._capture(state, state.decode, bucket, law)
        state.rows[bucket].copy_(saved)
        self._graphs[key] = graph
        return graph

    def _step_fn(self, state: "_State", bucket: int):
        """The full bucket's step under torch.compile (inductor fuses the norms, rotary, activations and
        sampling around the attention operator); smaller buckets, the tail of a call, run it eager."""
        if bucket != self.num_slots or self.compile_failure is not None:
            return state.decode
        if self._compiled is None or self._compiled[0] is not state:
            self._compiled = (state, torch.compile(state.decode, dynamic=False, fullgraph=self.graph_break is None))
        return self._compiled[1]

    def _capture(self, state: "_State", fn, bucket: int, law: Law):
        """A CUDA graph of one step of `fn`, warmed up on a side stream; None (and the failure recorded
        in describe()) if it cannot be captured."""
        compiled = fn is not state.decode
        # Only the engine's own compiled step leaves the call's force_eager stance: blocks compiled for
        # training (a generation copy is a deep copy of them) must not compile for decode shapes, least
        # of all inside a capture, where compiling fails and every step would fall back to eager.
        stance = torch.compiler.set_stance("default") if compiled else contextlib.nullcontext()
        try:
            with stance:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        fn(self.model, bucket, law)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    fn(self.model, bucket, law)
            self._pool = graph.pool()
            return graph
        except Exception as exc:  # recorded in describe(); the call goes on without it
            why = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            if compiled:
                self.compile_failure = why
                self._broke = isinstance(exc, torch._dynamo.exc.Unsupported)
            else:
                self.graph_failure = why
            return None

    def reserve(self, max_len: int, max_new: int) -> None:
        """Size the cache for calls of up to `max_len` positions (prompt + new) and `max_new` new tokens
        from the first call on: a run that knows its longest rollout (GRPO's planned width) then never
        reallocates it, nor recaptures and recompiles its steps, when a longer prompt comes."""
        self._reserved = (max_len, max_new)

    def _state_for(self, max_len: int, max_new: int) -> "_State":
        if self._state is not None and self._state.fits(max_len, max_new):
            return self._state
        max_len, max_new = max(max_len, self._reserved[0]), max(max_new, self._reserved[1])
        self._graphs.clear()
        self._state = None
        self._state = _State(self.model, self.num_slots, _round_up(max_len, SLOT_POSITIONS_MULTIPLE),
                             _round_up(max_new, SLOT_POSITIONS_MULTIPLE), self.device,
                             self._routing)
        return self._state

    # -------------------------------------------------------------------------------- provenance

    def describe(self) -> dict[str, Any]:
        state = self._state
        dtype = next(self.model.parameters()).dtype
        kernel = None if state is None else " + ".join(sorted(state.cache.decode_paths)) or None
        return {
            "backend": self.backend.value,
            **getattr(self, "resolution", _DIRECT),
            "entry": "align decode loop (align.generation.align_engine) on the model's own modules",
            "mode_requested": self.cfg.mode.value,
            "mode": self.mode.value,
            "cache_implementation": "slots",
            "slots": self.num_slots,
            "cache_positions": None if state is None else state.cache.max_len,
            "cache_bytes": None if state is None else state.cache.nbytes,
            "decode_attention": kernel,
            "prefill": "packed" if self.packed_prefill else "left-padded",
            "prefill_attention": None if state is None else " + ".join(sorted(state.cache.prefill_paths)) or None,
            "cuda_graphs": self.graphs and self.graph_failure is None,
            "cuda_graph_failure": self.graph_failure,
            "compiled_step": self.graphs and self.graph_failure is None and self.compile_failure is None,
            "compile_failure": self.compile_failure,
            "compile_graph_break": self.graph_break,
            "sync_every": self.cfg.sync_every,
            "router_topk": f"recorded per token from {len(self._routing)} MoE routers" if self._routing else None,
            "device": str(self.device),
            "dtype": str(dtype).removeprefix("torch."),
            "attn_implementation": f"{ALIGN_SLOTS} (prefill: sdpa with align's mask)",
            "weights": "shared with the training model (no sync)" if self.shares_weights else "copy (sync_from)",
            "batch_size": self.cfg.batch_size,
            "pad_to_multiple_of": self.cfg.pad_to_multiple_of,
            "lockstep": self.cfg.lockstep,
            "pad_token_id": self.pad_token_id,
            "eos_token_ids": list(self.eos_token_ids),
            "logprobs": "log_softmax(logits / temperature) at the token; temperature 1 when greedy",
            "sampler_logprobs": "log-prob after temperature and top-k/top-p truncation, renormalised; 0 when greedy",
            "rng": "per row: inverse CDF of a hash of (derive_seed(seed, prompt, sample), step)",
            "last_call": dict(self.last_call),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        }


class _State:
    """The device tensors of the decode loop: the cache, per-slot rows state, the outputs, and the
    per-bucket row lists a captured step reads. Slot `num_slots` is a spare that fills short buckets."""

    def __init__(self, model, num_slots: int, max_len: int, max_new: int, device: torch.device,
                 routing: Optional[Routing] = None) -> None:
        dtype = next(model.parameters()).dtype
        self.cache = SlotCache(num_slots + 1, max_len, _kv_shapes(model), layer_geometry(model.config), dtype, device)
        self.max_new = max_new
        self.scratch = num_slots
        slots = num_slots + 1
        long = dict(dtype=torch.long, device=device)
        self.last = torch.zeros(slots, **long)
        self.position = torch.zeros(slots, **long)
        self.count = torch.zeros(slots, **long)
        self.keys = torch.zeros(slots, **long)
        self.active = torch.zeros(slots, dtype=torch.bool, device=device)
        self.tokens = torch.zeros(slots, max_new + 1, **long)  # the last column takes idle rows' writes
        self.logprobs = torch.zeros(slots, max_new + 1, dtype=torch.float32, device=device)
        self.sampler = torch.zeros_like(self.logprobs)
        self.limit = torch.zeros((), **long)
        self.temperature = torch.ones((), dtype=torch.float32, device=device)
        self.top_k = torch.zeros(1, **long)
        self.top_p = torch.ones((), dtype=torch.float64, device=device)  # 1 - top_p as the warper rounds it
        self.stops = torch.zeros(0, **long)
        self.rows = {b: torch.full((b,), self.scratch, **long) for b in _buckets(num_slots)}
        self.routing = routing
        self.experts: Optional[torch.Tensor] = None
        """[slots, max_new + 1, routers, k] the experts picked for each token (`record_routers`), allocated at
        the first prefill (which tells k); int16, which holds any expert index a router of today has."""

    def routed(self, pick) -> Optional[torch.Tensor]:
        return None if self.routing is None else self.routing.picked(pick)

    def fits(self, max_len: int, max_new: int) -> bool:
        return max_len <= self.cache.max_len and max_new <= self.max_new

    def set_call(self, spec: SamplingSpec, stops: tuple[int, ...]) -> None:
        self.limit.fill_(spec.max_new_tokens)
        self.temperature.fill_(spec.temperature if spec.temperature > 0 else 1.0)
        vocab = None if spec.top_k == 0 else spec.top_k
        self.top_k.fill_(0 if vocab is None else vocab)
        self.top_p.fill_(spec.top_p)
        if self.stops.numel() != len(stops) or self.stops.tolist() != list(stops):
            self.stops = torch.tensor(list(stops), dtype=torch.long, device=self.active.device)
        self.active.zero_()

    def _draw(self, logits, keys, steps, law):
        top_k = self.top_k.clamp(max=logits.shape[-1])
        return device_sampling.sample(logits, keys, steps, law, self.temperature, top_k, self.top_p)

    def start(self, slots, keys, logits, lengths, law: Law, experts: Optional[torch.Tensor] = None) -> None:
        """First token of freshly prefilled rows: `slots` (rows,), their `keys`, prompt `logits`, prompt `lengths`,
        and (MoE, recorded) the `experts` [rows, routers, k] their prompts' last positions were routed to."""
        if experts is not None:
            if self.experts is None:
                self.experts = torch.zeros(self.tokens.shape[0], self.tokens.shape[1], *experts.shape[1:],
                                           dtype=torch.int16, device=self.tokens.device)
            self.experts[slots, 0] = experts.to(torch.int16)
        self.keys[slots] = keys
        token, lp, sp = self._draw(logits, keys, torch.zeros_like(keys), law)
        self.tokens[slots, 0], self.logprobs[slots, 0], self.sampler[slots, 0] = token, lp, sp
        n = slots.numel() // lengths.numel()
        self.last[slots] = token
        self.position[slots] = lengths.repeat_interleave(n)
        self.count[slots] = 1
        self.active[slots] = ~(torch.isin(token, self.stops) | (self.limit <= 1))

    def decode(self, model, bucket: int, law: Law) -> None:
        """One decode step for the rows of `self.rows[bucket]` (capturable: no host sync)."""
        rows = self.rows[bucket]
        token_in, pos = self.last[rows], self.position[rows]
        self.cache.rows = StepRows(slots=rows, positions=pos, prefill=False)
        logits = model(input_ids=token_in[:, None], position_ids=pos[:, None], cache=self.cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1].float()
        t, act = self.count[rows], self.active[rows]
        token, lp, sp = self._draw(logits, self.keys[rows], t, law)
        col = torch.where(act, t, self.max_new)
        self.tokens[rows, col], self.logprobs[rows, col], self.sampler[rows, col] = token, lp, sp
        if self.routing is not None:
            self.experts[rows, col] = self.routing.picked(lambda ids: ids).to(torch.int16)
        stop = torch.isin(token, self.stops) | (t + 1 >= self.limit)
        self.last[rows] = torch.where(act, token, token_in)
        self.position[rows] = torch.where(act, pos + 1, pos)
        self.count[rows] = torch.where(act, t + 1, t)
        self.active[rows] = act & ~stop

    def harvest(self, slots: list[int], rows: list[tuple[int, int]], stops: tuple[int, ...], max_new: int
                ) -> list[Completion]:
        """The completions of stopped `slots` ((prompt, sample) `rows`), read in one copy per tensor."""
        if not slots:
            return []
        at = torch.tensor(slots, device=self.tokens.device)
        counts, tokens = self.count[at].tolist(), self.tokens[at].tolist()
        logprobs, sampler = self.logprobs[at].tolist(), self.sampler[at].tolist()
        experts = None if self.experts is None else self.experts[at].cpu()
        out = []
        for i, ((p, s), n, t, lp, sp) in enumerate(zip(rows, counts, tokens, logprobs, sampler)):
            reason = FinishReason.stop if n and t[n - 1] in stops else FinishReason.length
            if reason is FinishReason.length and n != max_new:
                raise RuntimeError(f"a row ended after {n} of {max_new} tokens without a stop token")
            routed = None if experts is None else experts[i, :n].transpose(0, 1).contiguous()
            out.append(Completion(p, s, tuple(t[:n]), tuple(lp[:n]), tuple(sp[:n]), reason, routed))
        return out


def unsupported(model: torch.nn.Module) -> Optional[str]:
    """Why align's engine cannot run `model` (None: it can): its cache addresses each attention layer
    through the layer's `k_proj` and `layer_idx`."""
    try:
        _kv_shapes(model)
    except ConfigError:
        return f"{type(model).__name__} has no attention layers with a k_proj and a layer_idx"
    return None


def _kv_shapes(model) -> dict[int, tuple[int, int]]:
    """(kv_heads, head_dim) of every decoder layer that writes keys (has a k_proj), by its layer index."""
    shapes = {}
    for module in model.modules():
        if hasattr(module, "layer_idx") and getattr(module, "k_proj", None) is not None and hasattr(module, "head_dim"):
            shapes[module.layer_idx] = (module.k_proj.out_features // module.head_dim, module.head_dim)
    if not shapes:
        raise ConfigError("generation.backend", f"the align engine found no attention layers with k_proj in "
                          f"{type(model).__name__}; generate with backend=hf")
    return shapes


def _buckets(num_slots: int) -> list[int]:
    sizes, b = [], 8
    while b < num_slots:
        sizes.append(b)
        b *= 2
    return sizes + [num_slots]


def _bucket(rows: int, num_slots: int) -> int:
    return next(b for b in _buckets(num_slots) if b >= rows)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@contextlib.contextmanager
def _decoding(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode and align's attention function on every config the model's modules read; both restored."""
    configs = {id(m.config): m.config for m in model.modules()
               if hasattr(getattr(m, "config", None), "_attn_implementation")}
    saved = {k: c._attn_implementation for k, c in configs.items()}
    was_training = model.training
    model.eval()
    for c in configs.values():
        c._attn_implementation = ALIGN_SLOTS
    try:
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation = saved[k]
        model.train(was_training)
