"""Distillation data: ancestral samples x ~ p_lm(· | prompt) written to disk in chunks.

For each prompt we draw ``length`` new tokens by pure ancestral sampling (temperature 1, no
top-k / top-p, so the HMM sees the LM's true distribution) with a KV cache, a batch at a time::

    x_t ~ softmax(W · h_{t-1}),   h_{t-1} = last-layer hidden state of the prefix prompt + x_<t

Sequences that emit EOS are padded with EOS up to ``length`` (the HMM models the padded,
fixed-length sequences; the padding has probability 1 under the LM). For every sampled token we
also keep ``log p_lm(x_t | prefix)`` (0 on padding) and, optionally, ``h_{t-1}`` — the hidden
state *from which x_t was sampled* — the feature that latent-variable distillation clusters
(:mod:`ctrlg.hmm.lvd`).

Chunks are ``chunk_00000.safetensors`` … in one directory with a ``meta.json``. Chunk ``i`` is
generated from ``seed`` and ``i`` alone, so an interrupted run resumes by skipping the chunks that
exist and produces the same data as an uninterrupted one.

Cost per step and row: the LM's cached forward (its matmuls are ~70 % of a step at batch 128 in
bfloat16 on one core), O(V) for the draw (one uniform per row against the CDF, in reused
buffers) and O(1) bytes of KV-cache writes per layer (:mod:`ctrlg.hmm.kv_cache`).
"""

from __future__ import annotations

import copy
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ctrlg.errors import CtrlgError
from ctrlg.lm.shared_context import cache_keyword, returned_cache
from ctrlg.validation import check_context_length
from ctrlg.vocab import eos_token_ids

__all__ = [
    "read_prompts",
    "sample_sequences",
    "sample_to_disk",
    "load_chunks",
    "list_chunks",
    "chunk_on_disk",
    "save_chunk",
]

META_NAME = "meta.json"


def read_prompts(path: str | Path) -> list[str]:
    """Non-empty lines of a text file, stripped."""
    path = Path(path)
    if not path.is_file():
        raise CtrlgError(f"prompt file {path} does not exist")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    prompts = [line for line in lines if line]
    if not prompts:
        raise CtrlgError(f"prompt file {path} has no non-empty lines")
    return prompts


def _eos_ids(model, tokenizer) -> list[int]:
    """The EOS ids (:func:`ctrlg.vocab.eos_token_ids`); at least one is needed for padding."""
    ids = eos_token_ids(tokenizer, model)
    if not ids:
        raise CtrlgError("neither the model nor the tokenizer defines an EOS token id")
    return ids


class DrawBuffers:
    """Work buffers [rows, V] reused by the steps of one sampling run: a fresh [128, 49152]
    float32 tensor per step costs page faults (~10 ms each on a loaded machine), more than the
    arithmetic done in it. ``view(name, B, V)`` is the first B rows of buffer ``name``."""

    def __init__(self):
        self._store: dict[str, torch.Tensor] = {}

    def view(self, name: str, rows: int, cols: int, device, dtype=torch.float32) -> torch.Tensor:
        buf = self._store.get(name)
        if (buf is None or buf.shape[0] < rows or buf.shape[1] != cols or buf.dtype != dtype
                or buf.device != torch.device(device)):
            buf = self._store[name] = torch.empty(rows, cols, dtype=dtype, device=device)
        return buf[:rows]


def output_logits(head, state: torch.Tensor, work: DrawBuffers) -> torch.Tensor:
    """float32 logits ``head(state)`` [B, V], written into reused buffers when ``head`` is a plain
    bias-free ``nn.Linear`` (the same matmul as ``head(state)``, bit for bit)."""
    weight = getattr(head, "weight", None)
    if type(head) is torch.nn.Linear and head.bias is None and not torch.is_grad_enabled():
        out = work.view("head", state.shape[0], weight.shape[0], state.device, state.dtype)
        logits = torch.mm(state, weight.t(), out=out)
    else:
        logits = head(state)
    if logits.dtype == torch.float32:
        return logits
    return work.view("logits", *logits.shape, logits.device).copy_(logits)  # = logits.float()


def _logsumexp(logits: torch.Tensor, work: DrawBuffers) -> torch.Tensor:
    """``torch.logsumexp(logits, -1, keepdim=True)`` computed by the same steps as ATen (max,
    Σ exp(x − max), log, + max), so bit for bit equal, with the [B, V] temporary in ``work``."""
    maxes = logits.amax(-1, keepdim=True)
    maxes.masked_fill_(maxes.abs() == float("inf"), 0)
    tmp = work.view("exp", *logits.shape, logits.device)
    total = torch.sub(logits, maxes, out=tmp).exp_().sum(-1, keepdim=True)
    return total.log_().add_(maxes)


def draw_inverse_cdf(logits: torch.Tensor, generator: torch.Generator,
                     work: DrawBuffers | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per row of ``logits`` [B, V] (float32) from softmax(logits) by inversion: with
    p = exp(logits − logsumexp), F = cumsum(p) and u ~ U[0, 1), return the first v with
    F_v > u · F_V (a token of probability 0 is never returned), and log p_v. O(B · V), one
    uniform per row. ``work`` reuses the [B, V] temporaries across calls; the result does not
    depend on it (bit for bit)."""
    work = work or DrawBuffers()
    lse = _logsumexp(logits, work)
    probs = torch.sub(logits, lse, out=work.view("exp", *logits.shape, logits.device)).exp_()
    cdf = torch.cumsum(probs, -1, out=work.view("cdf", *logits.shape, logits.device))
    u = torch.rand(logits.shape[0], 1, generator=generator, device=logits.device)
    drawn = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0].clamp_max_(logits.shape[1] - 1)
    return drawn, (logits.gather(1, drawn[:, None]) - lse)[:, 0]


def draw_multinomial(logits: torch.Tensor, generator: torch.Generator,
                     work: DrawBuffers | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per row of softmax(``logits``) with ``torch.multinomial``, and its log-probability
    (the previous default, kept as the baseline; ``work`` is unused)."""
    logp = torch.log_softmax(logits, -1)
    drawn = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
    return drawn, logp.gather(1, drawn[:, None])[:, 0]


_SAMPLERS = {"inverse_cdf": draw_inverse_cdf, "multinomial": draw_multinomial}
KV_CACHES = ("preallocated", "dynamic")


class _Decoder:
    """The per-step state of :func:`sample_sequences`: the KV cache, the attention mask over the
    cache's columns, the position of each row's next token, and which batch rows are still
    sampling. Finished rows are dropped from the batch (their cache rows copied away) only once
    they are 1/16 of it: until then they run along on padding and their outputs are ignored
    (each row's LM output does not depend on the other rows; tested)."""

    def __init__(self, model, input_ids, attention_mask, length, prefix_ids, prefix_cache,
                 kv_cache: str):
        from transformers import DynamicCache  # heavy import (seconds): only when an LM is run

        # kv_cache subclasses a transformers class, so importing it imports transformers too
        from ctrlg.hmm.kv_cache import empty_preallocated_cache, preallocated_cache

        B, S = input_ids.shape
        device = input_ids.device
        P = len(prefix_ids) if prefix_ids is not None else 0
        mask = attention_mask.long()
        if P:
            mask = torch.cat([torch.ones(B, P, dtype=mask.dtype, device=device), mask], 1)
            if prefix_cache is None:
                prefix_cache = prefix_kv_cache(model, prefix_ids)
        self.preallocated = kv_cache == "preallocated"
        if self.preallocated:  # one buffer per layer and the whole mask, written in place
            capacity = P + S + length
            self.cache = (preallocated_cache(prefix_cache, capacity, B) if P
                          else empty_preallocated_cache(model, B, capacity))
            self.mask = torch.zeros(B, capacity, dtype=mask.dtype, device=device)
            self.mask[:, :P + S] = mask
        else:  # transformers' DynamicCache, grown by concatenation (the previous default)
            if P:
                self.cache = copy.deepcopy(prefix_cache)
                self.cache.batch_repeat_interleave(B)
            else:
                self.cache = DynamicCache()
            self.mask = mask
        self.filled = P + S  # mask columns in use
        self.positions = (mask.cumsum(-1) - 1).clamp_min(0)[:, -S:]
        self.step_ids = input_ids
        self.rows = torch.arange(B, device=device)  # output row of each batch row
        self.live = torch.ones(B, dtype=torch.bool, device=device)

    def forward(self, backbone) -> torch.Tensor:
        """Run the pending tokens; returns the last-layer state [n, d] of the live rows."""
        out = backbone(input_ids=self.step_ids, attention_mask=self.mask, position_ids=self.positions,
                       use_cache=True, **{cache_keyword(backbone): self.cache})
        self.cache = returned_cache(out)
        state = out.last_hidden_state[:, -1]
        return state if bool(self.live.all()) else state[self.live]

    def advance(self, drawn: torch.Tensor, going: torch.Tensor, pad_id: int) -> None:
        """Feed ``drawn`` (one token per live row) next; rows with ``going`` False are finished."""
        live_index = self.live.nonzero()[:, 0]
        self.live[live_index[~going]] = False
        dead = int((~self.live).sum())
        if not self.preallocated or dead * 16 >= len(self.live):
            keep = self.live.nonzero()[:, 0]
            if dead:
                self.cache.batch_select_indices(keep)
                self.mask, self.positions = self.mask[keep], self.positions[keep]
                self.rows, self.live = self.rows[keep], self.live[keep]
            step = drawn[going]
        else:  # finished rows stay in the batch on padding until enough have finished
            step = torch.full((len(self.live),), pad_id, dtype=drawn.dtype, device=drawn.device)
            step[self.live] = drawn[going]
        self.step_ids = step[:, None]
        self.positions = self.positions[:, -1:] + 1
        if self.preallocated:
            self.mask[:, self.filled] = 1
        else:
            self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.mask), 1)], 1)
        self.filled += 1

    def live_rows(self) -> torch.Tensor:
        """The output row of each live batch row."""
        return self.rows[self.live]


@torch.no_grad()
def sample_sequences(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, length: int, *,
                     eos_token_ids: Sequence[int], generator: torch.Generator,
                     return_hidden: bool = False, prefix_ids: torch.Tensor | None = None,
                     prefix_cache=None, sampler: str = "inverse_cdf",
                     kv_cache: str = "preallocated") -> dict[str, torch.Tensor]:
    """Ancestral sampling of ``length`` tokens for a left-padded prompt batch with a KV cache.

    With ``prefix_ids`` [P] (a token prefix shared by every prompt, e.g. the chat template's
    system turn), each row's prompt is ``prefix_ids + input_ids[row]``: the prefix is run once
    (or taken from ``prefix_cache``, the DynamicCache of ``prefix_ids`` at batch 1) and its KV
    cache repeated over the batch; the padding then sits between prefix and suffix, which the
    attention mask and explicit position ids handle.

    ``sampler`` picks how a token is drawn from softmax(logits): ``"inverse_cdf"`` (one uniform
    per row against the cumulative sum, :func:`draw_inverse_cdf`) or ``"multinomial"``
    (``torch.multinomial``, which draws V exponentials per row and costs more than the LM's output
    layer at V = 49k). Both are exact ancestral sampling; they consume the generator differently.
    ``kv_cache``: ``"preallocated"`` (:mod:`ctrlg.hmm.kv_cache`, written in place; finished rows
    leave the batch in groups) or ``"dynamic"`` (transformers' DynamicCache grown by ``cat``, the
    previous default). Both sample the same distribution; the LM's numbers may differ in the last
    place (attention over the buffer's masked columns; a draw changes only if that moves a CDF
    boundary across its uniform), and are equal bit for bit for the embedded LM in bfloat16 with
    grouped attention (benchmarks/bench_sampling.py compares a chunk).

    Returns ``tokens`` int64 [B, length] (EOS-padded after the first EOS), ``logprob`` float32
    [B, length] (log p_lm(x_t | prefix); 0 after the first EOS), and with ``return_hidden``,
    ``hidden`` [B, length, d] (model dtype): the last-layer state from which x_t was sampled.
    """
    if sampler not in _SAMPLERS:
        raise CtrlgError(f"sampler must be one of {sorted(_SAMPLERS)}, got {sampler!r}")
    if kv_cache not in KV_CACHES:
        raise CtrlgError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
    prompt = input_ids.shape[1] + (0 if prefix_ids is None else int(prefix_ids.numel()))
    check_context_length(model, prompt, length, what="the longest distillation prompt")
    draw, work = _SAMPLERS[sampler], DrawBuffers()
    device = input_ids.device
    B = input_ids.shape[0]
    pad_id = int(eos_token_ids[0])
    eos = torch.tensor(list(eos_token_ids), device=device)
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    head = model.get_output_embeddings()
    decoder = _Decoder(model, input_ids, attention_mask, length, prefix_ids, prefix_cache, kv_cache)
    tokens = torch.full((B, length), pad_id, dtype=torch.long, device=device)
    logprob = torch.zeros(B, length, dtype=torch.float32, device=device)
    hidden = None
    for t in range(length):
        state = decoder.forward(backbone)
        drawn, drawn_logp = draw(output_logits(head, state, work), generator, work)
        rows = decoder.live_rows()
        if return_hidden:
            if hidden is None:
                hidden = torch.zeros(B, length, state.shape[-1], dtype=state.dtype, device=device)
            hidden[rows, t] = state
        tokens[rows, t] = drawn
        logprob[rows, t] = drawn_logp
        going = ~torch.isin(drawn, eos)
        if not bool(going.any()) or t == length - 1:
            break
        decoder.advance(drawn, going, pad_id)
    result = {"tokens": tokens, "logprob": logprob}
    if return_hidden:
        result["hidden"] = hidden
    return result


@torch.no_grad()
def prefix_kv_cache(model, prefix_ids: torch.Tensor):
    """The DynamicCache of running ``prefix_ids`` [P] through ``model`` at batch size 1."""
    from transformers import DynamicCache  # heavy import (seconds): only when an LM is run

    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    ids = torch.as_tensor(prefix_ids, device=next(model.parameters()).device)[None]
    out = backbone(input_ids=ids, use_cache=True, **{cache_keyword(backbone): DynamicCache()})
    return returned_cache(out)


def shared_prefix(token_lists: Sequence[Sequence[int]]) -> list[int]:
    """Longest common prefix of the token lists, less one token so every suffix is non-empty."""
    first = list(token_lists[0])
    n = min(len(t) for t in token_lists) - 1
    for other in token_lists[1:]:
        k = 0
        while k < n and other[k] == first[k]:
            k += 1
        n = k
    return first[:max(n, 0)]


def list_chunks(directory: str | Path) -> list[Path]:
    return sorted(Path(directory).glob("chunk_*.safetensors"))


def _check_sample_args(num_sequences, length, chunk_size, batch_size, prompts, shard):
    """Validate :func:`sample_to_disk`'s sizes; returns ``shard`` as a pair of ints (or None)."""
    if num_sequences <= 0 or length <= 0 or chunk_size <= 0 or batch_size <= 0:
        raise CtrlgError(f"num_sequences, length, chunk_size and batch_size must be positive; got "
                         f"{num_sequences}, {length}, {chunk_size}, {batch_size}")
    if not prompts:
        raise CtrlgError("prompts is empty")
    if shard is None:
        return None
    shard = (int(shard[0]), int(shard[1]))
    if not 0 <= shard[0] < shard[1]:
        raise CtrlgError(f"shard must be (i, n) with 0 <= i < n, got {shard}")
    return shard


def _write_meta(out_dir: Path, meta: dict) -> None:
    """Write ``meta.json``; an existing one made with other settings raises CtrlgError (chunk i
    depends on the seed, sizes, prompts and i only, so ``num_sequences`` may change)."""
    meta_file = out_dir / META_NAME
    if meta_file.is_file():
        old = json.loads(meta_file.read_text())
        clash = {k: (old.get(k), v) for k, v in meta.items()
                 if k != "num_sequences" and old.get(k) != v}
        if clash:
            raise CtrlgError(f"{out_dir} holds samples made with other settings {clash}; "
                             f"use another directory to sample afresh")
    meta_file.write_text(json.dumps(meta, indent=2))


def _sampling_meta(model, eos_ids, num_prompts, *, num_sequences, length, chunk_size, batch_size,
                   seed, return_hidden, sampler) -> dict:
    """What decides the samples of a folder (checked on resume)."""
    return {"num_sequences": num_sequences, "length": length, "chunk_size": chunk_size,
            "batch_size": batch_size,  # rows drawn together share the chunk's RNG stream
            "seed": seed, "num_prompts": num_prompts, "eos_token_ids": eos_ids,
            "pad_token_id": eos_ids[0], "model": getattr(model.config, "_name_or_path", "") or "",
            "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
            "return_hidden": bool(return_hidden), "sampler": sampler,
            # the LM's numerics decide the samples too
            "model_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "attention": str(getattr(model.config, "_attn_implementation", None))}


def chunk_on_disk(path: Path, rows: int) -> bool:
    """Whether chunk ``path`` exists (a resumed run keeps it); CtrlgError if it holds another
    number of sequences than ``rows``."""
    if not path.is_file():
        return False
    with safe_open(str(path), "pt") as handle:
        rows_on_disk = handle.get_slice("tokens").get_shape()[0]
    if rows_on_disk != rows:
        raise CtrlgError(f"{path} holds {rows_on_disk} sequences, expected {rows}; sample into "
                         f"a fresh directory")
    return True


def save_chunk(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write one chunk atomically (a temporary file renamed): a chunk on disk is always complete."""
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)


class _ChunkMaker:
    """Makes chunk i of a folder: its sequences' prompts (a seeded permutation), a generator
    seeded with (seed, i), batches through :func:`sample_sequences`, one atomic safetensors file."""

    def __init__(self, model, tokenizer, prompts, out_dir: Path, *, num_sequences, length,
                 chunk_size, batch_size, seed, eos_ids, share_prefix, bar, **sampling):
        self.model, self.tokenizer, self.out_dir, self.bar = model, tokenizer, out_dir, bar
        self.num_sequences, self.length, self.chunk_size = num_sequences, length, chunk_size
        self.batch_size, self.seed, self.eos_ids, self.sampling = batch_size, seed, eos_ids, sampling
        self.num_prompts = len(prompts)
        self.perm = np.random.default_rng(seed).permutation(len(prompts))
        self.device = next(model.parameters()).device
        self.encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        prefix = shared_prefix(self.encoded) if share_prefix and len(prompts) > 1 else []
        self.prefix_len = len(prefix)
        self.prefix_ids = torch.tensor(prefix, dtype=torch.long, device=self.device) if prefix else None
        self.prefix_cache = prefix_kv_cache(model, self.prefix_ids) if prefix else None
        self.pad_lock = threading.Lock()  # the tokenizer is not thread-safe

    def __call__(self, chunk: int, hidden_dtype=torch.float16) -> None:
        start = chunk * self.chunk_size
        stop = min(self.num_sequences, (chunk + 1) * self.chunk_size)
        path = self.out_dir / f"chunk_{chunk:05d}.safetensors"
        if chunk_on_disk(path, stop - start):
            self.bar.update(stop - start)
            return
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(self.seed) * 1_000_003 + chunk)
        prompt_index = torch.tensor([int(self.perm[k % self.num_prompts]) for k in range(start, stop)])
        parts: dict[str, list[torch.Tensor]] = {}
        for b in range(0, stop - start, self.batch_size):
            rows = prompt_index[b:b + self.batch_size].tolist()
            with self.pad_lock:
                enc = self.tokenizer.pad({"input_ids": [self.encoded[i][self.prefix_len:] for i in rows]},
                                         return_tensors="pt", padding=True)
            res = sample_sequences(self.model, enc["input_ids"].to(self.device),
                                   enc["attention_mask"].to(self.device), self.length,
                                   eos_token_ids=self.eos_ids, generator=generator,
                                   prefix_ids=self.prefix_ids, prefix_cache=self.prefix_cache,
                                   **self.sampling)
            for key, value in res.items():
                value = value.cpu()
                parts.setdefault(key, []).append(value.to(hidden_dtype) if key == "hidden" else value)
            self.bar.update(len(rows))
        tensors = {k: torch.cat(v).contiguous() for k, v in parts.items()}
        tensors["tokens"] = tensors["tokens"].to(torch.int32)
        tensors["prompt_index"] = prompt_index.to(torch.int32)
        save_chunk(path, tensors)


def sample_to_disk(model, tokenizer, prompts: Sequence[str], out_dir: str | Path, *,
                   num_sequences: int, length: int, chunk_size: int = 256, batch_size: int = 32,
                   seed: int = 0, return_hidden: bool = True, hidden_dtype=torch.float16,
                   share_prefix: bool = True, sampler: str = "inverse_cdf",
                   kv_cache: str = "preallocated", shard: tuple[int, int] | None = None,
                   workers: int = 1, progress: bool | None = None) -> Path:
    """Sample ``num_sequences`` EOS-padded sequences of ``length`` tokens into ``out_dir`` as
    ``ceil(num_sequences / chunk_size)`` chunks (tokens, logprob, prompt_index, hidden).

    Sequence k uses prompt ``prompts[perm[k % len(prompts)]]`` for a seeded permutation ``perm``;
    chunk i's sampling RNG is seeded with (seed, i), so chunks can be made in any order or by
    several processes: with ``shard = (i, n)`` only chunks c with c mod n = i are made (run n
    processes, one per i, into the same folder). ``workers`` > 1 makes that many chunks at once
    in threads of this process (PyTorch releases the GIL inside its ops; pair it with
    ``torch.set_num_threads(1)`` so each chunk runs on its own core). ``sampler`` and ``kv_cache``
    as in :func:`sample_sequences`. The prompts' common token prefix is run once and its KV cache
    shared (``share_prefix``). Existing chunks are kept (resume); a ``meta.json`` that disagrees
    with the arguments raises CtrlgError.
    """
    shard = _check_sample_args(num_sequences, length, chunk_size, batch_size, prompts, shard)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    eos_ids = _eos_ids(model, tokenizer)
    sizes = dict(num_sequences=num_sequences, length=length, chunk_size=chunk_size,
                 batch_size=batch_size, seed=seed)
    _write_meta(out_dir, _sampling_meta(model, eos_ids, len(prompts), return_hidden=return_hidden,
                                        sampler=sampler, **sizes))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    bar = tqdm(total=num_sequences, desc="sampling", unit="seq",
               disable=not (sys.stderr.isatty() if progress is None else progress))
    try:
        make = _ChunkMaker(model, tokenizer, prompts, out_dir, eos_ids=eos_ids,
                           share_prefix=share_prefix, bar=bar, return_hidden=return_hidden,
                           sampler=sampler, kv_cache=kv_cache, **sizes)
        todo = [c for c in range(-(-num_sequences // chunk_size))
                if shard is None or c % shard[1] == shard[0]]
        if workers <= 1:
            for chunk in todo:
                make(chunk, hidden_dtype)
        else:  # chunks are independent and seeded by their number: same data in any order
            with ThreadPoolExecutor(max_workers=int(workers)) as pool:
                for future in [pool.submit(make, c, hidden_dtype) for c in todo]:
                    future.result()
    finally:
        tokenizer.padding_side = padding_side
        bar.close()
    return out_dir


def load_chunks(directory: str | Path, keys: Sequence[str] = ("tokens",), *,
                chunks: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """Concatenate ``keys`` over the chunks in ``directory`` (all, or the listed chunk numbers).
    Tokens are returned as int64."""
    paths = list_chunks(directory)
    if not paths:
        raise CtrlgError(f"{directory} holds no sample chunks (chunk_*.safetensors)")
    if chunks is not None:
        paths = [paths[i] for i in chunks]
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for path in paths:
        data = load_file(str(path))
        for k in keys:
            if k not in data:
                raise CtrlgError(f"{path} has no tensor {k!r} (sampled without it?)")
            parts[k].append(data[k])
    out = {k: torch.cat(v) for k, v in parts.items()}
    if "tokens" in out:
        out["tokens"] = out["tokens"].long()
    return out
