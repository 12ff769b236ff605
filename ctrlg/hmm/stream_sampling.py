"""Throughput sampler for distillation: ancestral samples of one shared prompt, continuously batched.

The distillation data of the adapted pipeline (GeLaTo, Ctrl-G) are unconditional samples
x ~ p_lm(· | prefix) of one prompt (the BOS token). :mod:`ctrlg.hmm.sampling` draws them a batch
at a time through the model's own forward: a batch runs until its longest sequence ends, so with
sentences of ~11 tokens EOS-padded to 32 most row-steps compute padding, and every step pays the
framework's per-layer overhead and a host synchronisation.

This module keeps ``rows`` decoding slots busy instead (continuous batching):

* the prompt is run once; its KV cache fills columns [0, P) of every slot and is never
  overwritten; the distribution of the first token, p_lm(x_1 | prefix), is computed once and
  drawn from by inversion of its CDF (one uniform per new sequence);
* each step runs one token per slot through :class:`LlamaStepper` — a plain-torch re-statement of
  the Llama forward (RMSNorm, rotary attention with grouped K/V heads over a static KV cache of
  P + L columns, SwiGLU MLP) reading the Hugging Face model's weights, with per-slot positions,
  so that slots at different depths share one batch;
* a slot whose sequence emits EOS (or reaches ``length`` tokens) starts the next sequence at once
  (its position returns to P); new sequences are numbered on the device by a prefix sum, and the
  host synchronises only every ``sync_every`` steps to see whether all ``num_sequences`` are done.

Every sequence is an exact ancestral sample of the LM: slot reuse changes only *which* slot draws
a sequence, never a token's distribution (tested against teacher-forced log-probabilities and by
a χ² test over all sequences of a tiny model). Draws use
:func:`ctrlg.hmm.sampling.draw_inverse_cdf`.

Cost per step: one LM token for each of ``rows`` slots — ≈ 2·params FLOPs per slot (the matmuls)
plus attention over ≤ P + L columns — and O(rows · V) for the draw. Useful work per step is every
slot's token except a sequence's wasted step when its first token is EOS and the drain at the end
(at most ``length`` steps with idle slots). With the adapted LM's ~11-token sentences padded to
32 this does ~2.7× fewer row-steps per sample than batch-synchronous decoding.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from ctrlg.errors import CtrlgError
from ctrlg.lm.shared_context import cache_keyword, returned_cache
from ctrlg.hmm.sampling import (DrawBuffers, _check_sample_args, _eos_ids, _write_meta,
                                chunk_on_disk, draw_inverse_cdf, list_chunks, save_chunk)

__all__ = ["LlamaStepper", "stream_sample", "stream_sample_to_disk", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("llama",)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: x / sqrt(mean(x²) + eps) · w, the statistics in float32."""
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


class LlamaStepper:
    """One decoding step of a Llama-architecture causal LM for a batch of independent slots.

    ``step(tokens [B], positions [B])`` embeds each slot's token, writes its keys and values into
    column ``positions[b]`` of the slot's static cache and attends over columns ≤ that position:
    h = x + Attn(RMSNorm(x)), x' = h + W_down(silu(W_gate·RMSNorm(h)) ⊙ W_up·RMSNorm(h)); returns
    the final RMSNorm'd state [B, d] (the ``last_hidden_state`` of Hugging Face's model) from which
    ``logits(state)`` gives the next-token scores. The weights are the model's own tensors (Q, K,
    V and gate/up fused by concatenation); rotary cos/sin come from the model's rotary module, so
    any rope scaling it implements is reproduced.
    """

    def __init__(self, model, rows: int, capacity: int):
        config = model.config
        if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
            raise CtrlgError(f"the stream sampler runs Llama-architecture LMs "
                             f"({SUPPORTED_MODEL_TYPES}); this LM is {config.model_type!r}: use "
                             f"sampling.engine=batched")
        backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.rows, self.capacity = int(rows), int(capacity)
        self.embed = backbone.embed_tokens.weight
        self.final_norm = backbone.norm.weight
        self.head_weight = model.get_output_embeddings().weight
        if getattr(model.get_output_embeddings(), "bias", None) is not None:
            raise CtrlgError("the stream sampler expects a bias-free output layer")
        self.layers = []
        for layer in backbone.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                         mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                if getattr(proj, "bias", None) is not None:
                    raise CtrlgError("the stream sampler expects bias-free Llama projections")
            self.layers.append({
                "in_norm": layer.input_layernorm.weight,
                "qkv": torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
                "o": attn.o_proj.weight,
                "post_norm": layer.post_attention_layernorm.weight,
                "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                "down": mlp.down_proj.weight,
            })
        positions = torch.arange(self.capacity, device=self.device)[None]
        probe = torch.zeros(1, self.capacity, self.head_dim, device=self.device, dtype=self.dtype)
        cos, sin = backbone.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)  # [capacity, head_dim]
        shape = (self.rows, self.kv_heads, self.capacity, self.head_dim)
        self.keys = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.values = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.scale = self.head_dim ** -0.5
        self._slots = torch.arange(self.rows, device=self.device)
        self._columns = torch.arange(self.capacity, device=self.device)

    def fill_prefix(self, past_key_values, length: int) -> None:
        """Copy a batch-1 KV cache of the prompt (Hugging Face ``past_key_values``) into columns
        [0, length) of every slot."""
        for i in range(len(self.layers)):
            if hasattr(past_key_values, "layers"):  # transformers ≥ 4.56 cache layers
                k, v = past_key_values.layers[i].keys, past_key_values.layers[i].values
            elif hasattr(past_key_values, "key_cache"):
                k, v = past_key_values.key_cache[i], past_key_values.value_cache[i]
            else:  # legacy tuples
                k, v = past_key_values[i]
            self.keys[i][:, :, :length] = k[0, :, :length].to(self.dtype)
            self.values[i][:, :, :length] = v[0, :, :length].to(self.dtype)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The final state [rows, d] after feeding ``tokens`` [rows] at ``positions`` [rows]."""
        B, H, K, D = self.rows, self.heads, self.kv_heads, self.head_dim
        x = self.embed[tokens]
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [B, 1, D]
        visible = (self._columns[None] <= positions[:, None])[:, None, None]  # [B, 1, 1, C]
        for i, w in enumerate(self.layers):
            hidden = _rms_norm(x, w["in_norm"], self.eps)
            q, k, v = torch.split(hidden @ w["qkv"].T, [H * D, K * D, K * D], -1)
            q, k, v = q.view(B, H, D), k.view(B, K, D), v.view(B, K, D)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            self.keys[i][self._slots, :, positions] = k
            self.values[i][self._slots, :, positions] = v
            scores = torch.matmul(q.view(B, K, H // K, D), self.keys[i].transpose(-1, -2))
            scores = (scores.float() * self.scale).masked_fill_(~visible, float("-inf"))
            attn = torch.matmul(torch.softmax(scores, -1).to(self.dtype), self.values[i])
            x = x + attn.reshape(B, H * D) @ w["o"].T
            hidden = _rms_norm(x, w["post_norm"], self.eps)
            gate, up = torch.chunk(hidden @ w["gate_up"].T, 2, -1)
            x = x + (torch.nn.functional.silu(gate) * up) @ w["down"].T
        return _rms_norm(x, self.final_norm, self.eps)

    def logits(self, state: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """float32 next-token scores [rows, V] of ``state``."""
        logits = torch.mm(state, self.head_weight.T)
        if out is None:
            return logits.float()
        return out.copy_(logits)


@torch.no_grad()
def _prefix(model, prefix_ids: torch.Tensor):
    """(KV cache, final state [d], float32 log-probabilities [V] of the first token) of the prompt."""
    from transformers import DynamicCache  # heavy import: only when an LM is run

    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    out = backbone(input_ids=prefix_ids[None], use_cache=True, **{cache_keyword(backbone): DynamicCache()})
    state = out.last_hidden_state[0, -1]
    logits = model.get_output_embeddings()(state[None]).float()[0]
    return returned_cache(out), state, torch.log_softmax(logits, -1)


@torch.no_grad()
def stream_sample(model, prefix_ids: Sequence[int] | torch.Tensor, num_sequences: int, length: int, *,
                  eos_token_ids: Sequence[int], generator: torch.Generator, rows: int = 1024,
                  return_hidden: bool = False, sync_every: int = 8,
                  stepper: LlamaStepper | None = None) -> dict[str, torch.Tensor]:
    """``num_sequences`` ancestral samples of ``length`` tokens after ``prefix_ids`` (module
    docstring), EOS-padded after the first EOS.

    Returns ``tokens`` int64 [N, length], ``logprob`` float32 [N, length] (log p_lm(x_t | prefix,
    x_<t); 0 on padding) and with ``return_hidden`` ``hidden`` [N, length, d] (model dtype): the
    final state from which x_t was drawn (for x_1 the prompt's). Sequence numbers follow the order
    in which sequences start. ``stepper`` reuses a :class:`LlamaStepper` (and its cache buffers)
    built for this model with ``rows`` slots and capacity ≥ P + length.
    """
    device = next(model.parameters()).device
    prefix_ids = torch.as_tensor(prefix_ids, dtype=torch.long, device=device).reshape(-1)
    P, N, L = int(prefix_ids.numel()), int(num_sequences), int(length)
    if P == 0:
        raise CtrlgError("stream_sample needs a non-empty prompt (e.g. the BOS token)")
    if N <= 0 or L <= 0 or rows <= 0:
        raise CtrlgError(f"num_sequences, length and rows must be positive; got {N}, {L}, {rows}")
    rows = min(int(rows), N)
    if stepper is None or stepper.rows != rows or stepper.capacity < P + L:
        stepper = LlamaStepper(model, rows, P + L)
    cache, prefix_state, first_logp = _prefix(model, prefix_ids)
    stepper.fill_prefix(cache, P)
    first_cdf = torch.cumsum(first_logp.exp().double(), 0)
    eos = torch.tensor(list(eos_token_ids), device=device)
    pad_id = int(eos_token_ids[0])
    # output row N is a sink for the writes of idle slots
    tokens = torch.full((N + 1, L), pad_id, dtype=torch.long, device=device)
    logprob = torch.zeros(N + 1, L, dtype=torch.float32, device=device)
    hidden = (torch.zeros(N + 1, L, prefix_state.shape[-1], dtype=stepper.dtype, device=device)
              if return_hidden else None)
    seq = torch.full((rows,), N, dtype=torch.long, device=device)  # sequence of each slot (N: none)
    t = torch.zeros(rows, dtype=torch.long, device=device)          # tokens drawn in that sequence
    last = torch.full((rows,), pad_id, dtype=torch.long, device=device)
    done = torch.ones(rows, dtype=torch.bool, device=device)        # slot needs a new sequence
    started = torch.zeros((), dtype=torch.long, device=device)
    work = DrawBuffers()

    def restart() -> None:
        """Give every finished slot the next sequence number (while any remain) and its first
        token, drawn from p_lm(x_1 | prefix)."""
        nonlocal started
        rank = torch.cumsum(done.long(), 0) - 1
        new = started + rank
        take = done & (new < N)
        started = torch.clamp(started + done.long().sum(), max=N)
        seq.copy_(torch.where(take, new, torch.where(done, N, seq)))
        u = torch.rand(rows, generator=generator, device=device, dtype=torch.float64)
        first = torch.searchsorted(first_cdf, u * first_cdf[-1], right=True).clamp_max_(len(first_cdf) - 1)
        write = torch.where(take, seq, N)
        tokens[write, 0] = first
        logprob[write, 0] = first_logp[first]
        if hidden is not None:
            hidden[write, 0] = prefix_state.to(hidden.dtype)
        t.copy_(torch.where(take, 1, t))
        last.copy_(torch.where(take, first, last))
        ended = take & (torch.isin(first, eos) | (L == 1))
        done.copy_(torch.where(take, ended, done))

    restart()
    steps = 0
    while True:
        if steps % sync_every == 0 and bool((done & (seq == N)).all()):
            break
        state = stepper.step(last, P + (t - 1).clamp_min(0))
        logits = stepper.logits(state, work.view("logits", rows, stepper.head_weight.shape[0],
                                                 device))
        drawn, drawn_logp = draw_inverse_cdf(logits, generator, work)
        active = ~done & (seq < N)
        write = torch.where(active, seq, N)
        column = t.clamp_max(L - 1)
        tokens[write, column] = drawn
        logprob[write, column] = drawn_logp
        if hidden is not None:
            hidden[write, column] = state.to(hidden.dtype)
        t.add_(active.long())
        ended = active & (torch.isin(drawn, eos) | (t >= L))
        last.copy_(torch.where(active, drawn, last))
        done.copy_(done | ended)
        restart()
        steps += 1
    result = {"tokens": tokens[:N], "logprob": logprob[:N], "steps": steps, "rows": rows}
    if hidden is not None:
        result["hidden"] = hidden[:N]
    return result


def _real_lengths(tokens: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """Tokens up to and including the first EOS of each row of ``tokens`` [N, L] (L if none)."""
    is_eos = torch.isin(tokens, torch.tensor(list(eos_ids), device=tokens.device))
    first = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, tokens.shape[1])
    return first


def stream_sample_to_disk(model, tokenizer, prompt: str, out_dir: str | Path, *, num_sequences: int,
                          length: int, chunk_size: int = 65536, rows: int = 4096, seed: int = 0,
                          hidden_chunks: int = 0, hidden_dtype=torch.float16,
                          shard: tuple[int, int] | None = None,
                          progress: bool | None = None) -> dict:
    """Sample ``num_sequences`` sequences of one ``prompt`` into ``out_dir`` as chunks of
    ``chunk_size`` (``chunk_00000.safetensors``…, the layout :func:`ctrlg.hmm.sampling.load_chunks`
    reads: tokens, logprob, prompt_index, and ``hidden`` in the first ``hidden_chunks`` chunks).

    Chunk i is drawn with a generator seeded by (seed, i) alone, so chunks can be made in any
    order, resumed (existing chunks are kept) or split over processes (``shard = (i, n)``: chunks
    c with c mod n = i). A ``meta.json`` records what decides the samples and is checked on
    resume. Returns timing figures: sequences, LM row-steps, seconds, and rates."""
    shard = _check_sample_args(num_sequences, length, chunk_size, rows, [prompt], shard)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    eos_ids = _eos_ids(model, tokenizer)
    prefix = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    device = next(model.parameters()).device
    meta = {"engine": "stream", "num_sequences": int(num_sequences), "length": int(length),
            "chunk_size": int(chunk_size), "rows": int(rows), "seed": int(seed), "num_prompts": 1,
            "prompt_ids": list(map(int, prefix)), "eos_token_ids": eos_ids, "pad_token_id": eos_ids[0],
            "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
            "hidden_chunks": int(hidden_chunks),
            "model_dtype": str(next(model.parameters()).dtype).replace("torch.", "")}
    _write_meta(out_dir, meta)
    num_chunks = -(-int(num_sequences) // int(chunk_size))
    todo = [c for c in range(num_chunks) if shard is None or c % shard[1] == shard[0]]
    bar = tqdm(total=len(todo), desc="sampling chunks", unit="chunk",
               disable=not (sys.stderr.isatty() if progress is None else progress))
    stats = {"sequences": 0, "row_steps": 0, "real_tokens": 0, "seconds": 0.0}
    stepper = None
    for chunk in todo:
        path = out_dir / f"chunk_{chunk:05d}.safetensors"
        size = min(int(chunk_size), int(num_sequences) - chunk * int(chunk_size))
        if chunk_on_disk(path, size):
            bar.update(1)
            continue
        generator = torch.Generator(device=device)
        generator.manual_seed(int(seed) * 1_000_003 + chunk)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        want_rows = min(int(rows), size)
        if stepper is None or stepper.rows != want_rows:
            stepper = LlamaStepper(model, want_rows, len(prefix) + int(length))
        res = stream_sample(model, prefix, size, length, eos_token_ids=eos_ids, generator=generator,
                            rows=want_rows, return_hidden=chunk < hidden_chunks, stepper=stepper)
        tensors = {"tokens": res["tokens"].to(torch.int32).cpu().contiguous(),
                   "logprob": res["logprob"].cpu().contiguous(),
                   "prompt_index": torch.zeros(size, dtype=torch.int32)}
        if "hidden" in res:
            tensors["hidden"] = res["hidden"].to(hidden_dtype).cpu().contiguous()
        stats["seconds"] += time.perf_counter() - start
        stats["sequences"] += size
        stats["row_steps"] += res["steps"] * res["rows"]
        stats["real_tokens"] += int(_real_lengths(res["tokens"], eos_ids).sum())
        save_chunk(path, tensors)
        bar.update(1)
    bar.close()
    seconds = max(stats["seconds"], 1e-9)
    stats.update(sequences_per_s=stats["sequences"] / seconds,
                 slots_per_s=stats["sequences"] * int(length) / seconds,
                 row_steps_per_s=stats["row_steps"] / seconds,
                 chunks_on_disk=len(list_chunks(out_dir)))
    return stats
