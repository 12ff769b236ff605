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
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ctrlg.errors import CtrlgError
from ctrlg.vocab import eos_token_ids

__all__ = [
    "commongen_prompts",
    "read_prompts",
    "sample_sequences",
    "sample_to_disk",
    "load_chunks",
    "list_chunks",
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


def commongen_prompts(concept_lines: Iterable[str], tokenizer=None) -> list[str]:
    """CommonGen-style instructions, one per concept line ("dog frisbee catch" →
    "Write a sentence using the words: dog, frisbee, catch."), deduplicated in order. With a
    ``tokenizer`` that has a chat template, each instruction is wrapped as a user turn with the
    assistant turn opened (``add_generation_prompt=True``)."""
    seen: dict[str, None] = {}
    for line in concept_lines:
        words = line.split()
        if words:
            seen.setdefault(" ".join(words), None)
    prompts = [f"Write a sentence using the words: {', '.join(c.split())}." for c in seen]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                 add_generation_prompt=True) for p in prompts]
    return prompts


def _eos_ids(model, tokenizer) -> list[int]:
    """The EOS ids (:func:`ctrlg.vocab.eos_token_ids`); at least one is needed for padding."""
    ids = eos_token_ids(tokenizer, model)
    if not ids:
        raise CtrlgError("neither the model nor the tokenizer defines an EOS token id")
    return ids


@torch.no_grad()
def sample_sequences(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, length: int, *,
                     eos_token_ids: Sequence[int], generator: torch.Generator,
                     return_hidden: bool = False, prefix_ids: torch.Tensor | None = None,
                     prefix_cache=None) -> dict[str, torch.Tensor]:
    """Ancestral sampling of ``length`` tokens for a left-padded prompt batch with a KV cache.

    With ``prefix_ids`` [P] (a token prefix shared by every prompt, e.g. the chat template's
    system turn), each row's prompt is ``prefix_ids + input_ids[row]``: the prefix is run once
    (or taken from ``prefix_cache``, the DynamicCache of ``prefix_ids`` at batch 1) and its KV
    cache repeated over the batch; the padding then sits between prefix and suffix, which the
    attention mask and explicit position ids handle.

    Returns ``tokens`` int64 [B, length] (EOS-padded after the first EOS), ``logprob`` float32
    [B, length] (log p_lm(x_t | prefix); 0 after the first EOS), and with ``return_hidden``,
    ``hidden`` [B, length, d] (model dtype): the last-layer state from which x_t was sampled.
    """
    from transformers import DynamicCache  # heavy import (seconds): only when an LM is run

    device = input_ids.device
    B = input_ids.shape[0]
    pad_id = int(eos_token_ids[0])
    eos = torch.tensor(list(eos_token_ids), device=device)
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    head = model.get_output_embeddings()
    mask = attention_mask.long()
    if prefix_ids is not None and len(prefix_ids) > 0:
        if prefix_cache is None:
            prefix_cache = prefix_kv_cache(model, prefix_ids)
        cache = copy.deepcopy(prefix_cache)
        cache.batch_repeat_interleave(B)
        mask = torch.cat([torch.ones(B, len(prefix_ids), dtype=mask.dtype, device=device), mask], 1)
    else:
        cache = DynamicCache()
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    step_ids = input_ids
    step_pos = positions[:, -input_ids.shape[1]:]
    tokens = torch.full((B, length), pad_id, dtype=torch.long, device=device)
    logprob = torch.zeros(B, length, dtype=torch.float32, device=device)
    hidden = None
    rows = torch.arange(B, device=device)  # the rows still sampling (finished rows are dropped)
    for t in range(length):
        out = backbone(input_ids=step_ids, attention_mask=mask, position_ids=step_pos,
                       past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        state = out.last_hidden_state[:, -1]
        logp = torch.log_softmax(head(state).float(), -1)
        drawn = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
        if return_hidden:
            if hidden is None:
                hidden = torch.zeros(B, length, state.shape[-1], dtype=state.dtype, device=device)
            hidden[rows, t] = state
        tokens[rows, t] = drawn
        logprob[rows, t] = logp.gather(1, drawn[:, None])[:, 0]
        going = ~torch.isin(drawn, eos)
        if not bool(going.any()):
            break
        if not bool(going.all()):
            keep = going.nonzero()[:, 0]
            cache.batch_select_indices(keep)
            rows, drawn, mask, step_pos = rows[keep], drawn[keep], mask[keep], step_pos[keep]
        step_ids = drawn[:, None]
        step_pos = step_pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype, device=device)], 1)
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
    out = backbone(input_ids=ids, past_key_values=DynamicCache(), use_cache=True)
    return out.past_key_values


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


def sample_to_disk(model, tokenizer, prompts: Sequence[str], out_dir: str | Path, *,
                   num_sequences: int, length: int, chunk_size: int = 256, batch_size: int = 32,
                   seed: int = 0, return_hidden: bool = True, hidden_dtype=torch.float16,
                   share_prefix: bool = True, progress: bool | None = None) -> Path:
    """Sample ``num_sequences`` EOS-padded sequences of ``length`` tokens into ``out_dir`` as
    ``ceil(num_sequences / chunk_size)`` chunks (tokens, logprob, prompt_index, hidden).

    Sequence k uses prompt ``prompts[perm[k % len(prompts)]]`` for a seeded permutation ``perm``;
    chunk i's sampling RNG is seeded with (seed, i). The prompts' common token prefix is run
    once and its KV cache shared (``share_prefix``). Existing chunks are kept (resume); a
    ``meta.json`` that disagrees with the arguments raises CtrlgError.
    """
    if num_sequences <= 0 or length <= 0 or chunk_size <= 0 or batch_size <= 0:
        raise CtrlgError(f"num_sequences, length, chunk_size and batch_size must be positive; got "
                         f"{num_sequences}, {length}, {chunk_size}, {batch_size}")
    if not prompts:
        raise CtrlgError("prompts is empty")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    eos_ids = _eos_ids(model, tokenizer)
    meta = {"num_sequences": num_sequences, "length": length, "chunk_size": chunk_size,
            "batch_size": batch_size,  # rows drawn together share the chunk's RNG stream
            "seed": seed, "num_prompts": len(prompts), "eos_token_ids": eos_ids,
            "pad_token_id": eos_ids[0], "model": getattr(model.config, "_name_or_path", "") or "",
            "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
            "return_hidden": bool(return_hidden)}
    meta_file = out_dir / META_NAME
    if meta_file.is_file():
        old = json.loads(meta_file.read_text())
        # chunk i depends on (seed, chunk_size, prompts, i) only, so num_sequences may change
        clash = {k: (old.get(k), v) for k, v in meta.items()
                 if k != "num_sequences" and old.get(k) != v}
        if clash:
            raise CtrlgError(f"{out_dir} holds samples made with other settings {clash}; "
                             f"use another directory to sample afresh")
    meta_file.write_text(json.dumps(meta, indent=2))

    perm = np.random.default_rng(seed).permutation(len(prompts))
    device = next(model.parameters()).device
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    num_chunks = -(-num_sequences // chunk_size)
    encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    prefix = shared_prefix(encoded) if share_prefix and len(prompts) > 1 else []
    prefix_ids = torch.tensor(prefix, dtype=torch.long, device=device) if prefix else None
    prefix_cache = prefix_kv_cache(model, prefix_ids) if prefix else None
    if progress is None:
        progress = sys.stderr.isatty()
    bar = tqdm(total=num_sequences, desc="sampling", unit="seq", disable=not progress)
    try:
        for chunk in range(num_chunks):
            start, stop = chunk * chunk_size, min(num_sequences, (chunk + 1) * chunk_size)
            path = out_dir / f"chunk_{chunk:05d}.safetensors"
            if path.is_file():
                with safe_open(str(path), "pt") as handle:
                    rows_on_disk = handle.get_slice("tokens").get_shape()[0]
                if rows_on_disk != stop - start:
                    raise CtrlgError(f"{path} holds {rows_on_disk} sequences, expected "
                                     f"{stop - start}; sample into a fresh directory")
                bar.update(stop - start)
                continue
            generator = torch.Generator(device=device)
            generator.manual_seed(int(seed) * 1_000_003 + chunk)
            prompt_index = torch.tensor([int(perm[k % len(prompts)]) for k in range(start, stop)])
            parts: dict[str, list[torch.Tensor]] = {}
            for b in range(start, stop, batch_size):
                rows = prompt_index[b - start:min(stop, b + batch_size) - start]
                enc = tokenizer.pad({"input_ids": [encoded[i][len(prefix):] for i in rows.tolist()]},
                                    return_tensors="pt", padding=True)
                res = sample_sequences(model, enc["input_ids"].to(device),
                                       enc["attention_mask"].to(device), length,
                                       eos_token_ids=eos_ids, generator=generator,
                                       return_hidden=return_hidden, prefix_ids=prefix_ids,
                                       prefix_cache=prefix_cache)
                for key, value in res.items():
                    value = value.cpu()
                    if key == "hidden":
                        value = value.to(hidden_dtype)
                    parts.setdefault(key, []).append(value)
                bar.update(len(rows))
            tensors = {k: torch.cat(v).contiguous() for k, v in parts.items()}
            tensors["tokens"] = tensors["tokens"].to(torch.int32)
            tensors["prompt_index"] = prompt_index.to(torch.int32)
            tmp = path.with_suffix(".tmp")
            save_file(tensors, str(tmp))
            tmp.replace(path)  # atomic: a chunk on disk is always complete
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
