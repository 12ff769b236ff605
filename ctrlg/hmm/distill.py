"""The distillation pipeline: LM samples → LVD initialisation → Baum-Welch → checkpoint + curve.

``distill(config)`` runs, from one plain config mapping (the Hydra config of
``python -m experiments.distill``):

1. sample ``sampling.num_sequences`` training and ``sampling.heldout_sequences`` held-out
   EOS-padded sequences of ``sampling.length`` tokens from the LM (:mod:`ctrlg.hmm.sampling`;
   the held-out set uses a disjoint slice of the prompts and another seed; resumable);
2. initialise the HMM with latent-variable distillation (:mod:`ctrlg.hmm.lvd`);
3. train it with the mini-batch EM schedule (:mod:`ctrlg.hmm.em`), recording the validation
   log-likelihood per token after each step;
4. evaluate on the *test* half of the held-out samples (the other half, "valid", gives the EM
   curve and, with ``em.keep_best``, early stopping): the HMM, a unigram model (add-one-smoothed, fitted on the
   same training tokens) and the LM itself (Σ log p_lm of the sampled tokens; the
   EOS padding has probability 1), all as mean log-likelihood per token of the padded sequences;
5. with ``head.enabled``, train the LM-conditioned prior head on the training samples' stored LM
   features against the HMM as saved (:mod:`ctrlg.hmm.head_training`) and measure the held-out
   prefix log-likelihood table (prefix lengths ``head.prefix_lengths``) on the test half;
6. write ``<output.dir>/hmm/{model.safetensors,config.json,prior_head.*}`` (and the same checkpoint to
   ``output.copy_to`` if set, e.g. the package's asset folder), ``curve.json``, ``curve.png`` and
   ``metrics.json``.
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Mapping

import torch

from ctrlg.data._files import bundled_path, data_path
from ctrlg.data.commongen_prompts import (DEFAULT_BOS_TOKEN, bos_text, commongen_prompts, prompt_text,
                                          target_text)
from ctrlg.data.commongen_targets import selected_indices
from ctrlg.data.story_prompts import continuation_prompts
from ctrlg.errors import CtrlgError
from ctrlg.hmm import EMBEDDED_HMMS, embedded_hmm_path
from ctrlg.hmm.em import baum_welch, heldout_ll_per_token, unigram_prior
from ctrlg.hmm.grouped_attention import GROUPED_ATTENTION, register
from ctrlg.hmm.head_training import prefix_loglik_table, train_prior_head
from ctrlg.hmm.lvd import lvd_init
from ctrlg.hmm.model import HMM
from ctrlg.hmm.quantize import support_from_tokens, topk_size
from ctrlg.hmm.sampling import load_chunks, read_prompts, sample_to_disk
from ctrlg.hmm.stream_sampling import stream_sample_to_disk
from ctrlg.lm import models
from ctrlg.validation import config_value
from ctrlg.vocab import tokenizer_fingerprint

__all__ = ["distill", "train_head_for", "build_prompts", "unigram_loglik", "plot_curve", "extra_training_tokens"]


_get = config_value  # a dotted key of the config (ctrlg.validation.config_value)


def build_prompts(cfg: Mapping, tokenizer) -> list[str]:
    """Prompts from ``prompts.file`` (or the inline list ``prompts.list``): ``format: commongen``
    turns concept lines into chat-template instructions, ``keywords`` into the supervised
    adapter's prompts (BOS + "Concepts: a, b, c.\nSentence:",
    :func:`ctrlg.data.commongen_prompts.prompt_text`), ``raw`` uses each line as is, ``chat``
    each line as the user's message under the tokenizer's chat template; ``bos`` is
    the single prompt "BOS" (``prompts.bos_token``) of unconditional sampling; ``story_prefixes``
    the continuation LM's prompts over prefixes of the story corpus's training passages
    (:func:`ctrlg.data.story_prompts.continuation_prompts`; ``prompts.file``: another JSONL of
    passages; ``prompts.per_passage`` cut points each). Deduplicated in order."""
    if _get(cfg, "prompts.format", "commongen") == "bos":
        return [bos_text(tokenizer, _get(cfg, "prompts.bos_token", DEFAULT_BOS_TOKEN))]
    if _get(cfg, "prompts.format") == "story_prefixes":
        prompts = continuation_prompts(tokenizer, int(_get(cfg, "prompts.per_passage", 1)),
                                       int(_get(cfg, "seed", 0)), _get(cfg, "prompts.file"),
                                       _get(cfg, "prompts.bos_token", DEFAULT_BOS_TOKEN))
        limit = _get(cfg, "prompts.limit")
        return prompts[:limit] if limit else prompts
    lines = list(_get(cfg, "prompts.list") or []) or read_prompts(
        _get(cfg, "prompts.file") or bundled_path("commongen.train.src_alpha.txt"))
    limit = _get(cfg, "prompts.limit")
    fmt = _get(cfg, "prompts.format", "commongen")
    if fmt == "commongen":
        prompts = commongen_prompts(lines, tokenizer if _get(cfg, "prompts.chat_template", True) else None)
    elif fmt == "keywords":
        bos = _get(cfg, "prompts.bos_token", DEFAULT_BOS_TOKEN)
        prompts = list(dict.fromkeys(prompt_text(line.split(), "keywords", tokenizer, bos)
                                     for line in lines if line.split()))
    elif fmt == "raw":
        prompts = list(dict.fromkeys(lines))
    elif fmt == "chat":
        prompts = list(dict.fromkeys(tokenizer.apply_chat_template(
            [{"role": "user", "content": line}], tokenize=False, add_generation_prompt=True)
            for line in lines))
    else:
        raise CtrlgError(f"prompts.format must be 'commongen', 'keywords', 'raw', 'chat', 'bos' "
                         f"or 'story_prefixes', got {fmt!r}")
    return prompts[:limit] if limit else prompts


def unigram_loglik(train_tokens: torch.Tensor, heldout_tokens: torch.Tensor, vocab_size: int) -> float:
    """Held-out mean log-likelihood per token of the add-one-smoothed training unigram."""
    return float(unigram_prior(train_tokens, vocab_size).log()[heldout_tokens.flatten()].mean())


def plot_curve(history: Mapping, path: Path, title: str = "") -> None:
    """Training and held-out log-likelihood per token against the EM step (PNG)."""
    import matplotlib  # optional plotting dependency, needed only here
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(history["step"][1:], history["train_ll"][1:], "o-", label="train (step's chunks, before update)")
    ax.plot(history["step"], history["heldout_ll"], "s-", label="held-out (after step)")
    ax.set_xlabel("EM step")
    ax.set_ylabel("log-likelihood per token (nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _sampling_model(cfg: Mapping, model_name, device):
    """The LM that draws the samples, in ``sampling.dtype`` (bfloat16 halves the cost of its
    matmuls on CPUs with bf16 instructions) with ``sampling.attention`` (``ctrlg_grouped``:
    :mod:`ctrlg.hmm.grouped_attention`)."""
    attention = _get(cfg, "sampling.attention")
    kwargs = {}
    if attention:
        if attention == GROUPED_ATTENTION:
            register()
        kwargs["attn_implementation"] = attention
    dtype = getattr(torch, str(_get(cfg, "sampling.dtype") or "float32"))
    return models.load_model(model_name, device=device, dtype=dtype,
                             adapter=_get(cfg, "model.adapter"), **kwargs)


def _train_head(cfg: Mapping, hmm, train: dict, test: dict, vocab_size: int, *, eos_ids, config: dict):
    """Fit the LM-conditioned prior head to the training samples (HMM frozen) and measure the
    held-out prefix log-likelihood table on the test samples (:mod:`ctrlg.hmm.head_training`)."""
    head, history = train_prior_head(
        hmm, train["hidden"], train["lvd_tokens"], eos_token_ids=eos_ids,
        inner_size=int(_get(cfg, "head.inner_size", 256)),
        valid_fraction=float(_get(cfg, "head.valid_fraction", 0.05)),
        epochs=int(_get(cfg, "head.epochs", 30)), patience=int(_get(cfg, "head.patience", 3)),
        lr=float(_get(cfg, "head.lr", 3e-4)), weight_decay=float(_get(cfg, "head.weight_decay", 0.0)),
        batch_size=int(_get(cfg, "head.batch_size", 1024)), seed=int(_get(cfg, "seed", 0)), config=config)
    table = prefix_loglik_table(
        hmm, head, test["tokens"], test["hidden"], test["logprob"],
        unigram_prior(train["tokens"], vocab_size).log(), eos_token_ids=eos_ids,
        prefix_lengths=tuple(k for k in _get(cfg, "head.prefix_lengths", (0, 4, 16))
                             if k < test["tokens"].shape[1]))  # short samples: the k that fit
    head.config["metrics"] = {"prefix_table": table, "valid_loss": min(history["valid_loss"] or [math.nan])}
    return head, {"history": history, "prefix_table": table}


@contextmanager
def _timed(timings: dict[str, float], key: str):
    """Record the wall-clock seconds of the ``with`` block as ``timings[key]``."""
    start = time.perf_counter()
    yield
    timings[key] = time.perf_counter() - start


def _split_prompts(cfg: Mapping, prompts: list[str]) -> tuple[list[str], list[str]]:
    """(training prompts, held-out prompts): the last ``prompts.heldout_fraction`` of the prompts
    (at least one, and at least one left for training) are held out; with ``prompts.format: bos``
    (unconditional sampling) the one prompt serves both, the held-out samples being drawn with
    another seed. O(#prompts)."""
    if _get(cfg, "prompts.format") == "bos":
        return prompts, prompts
    n_heldout_prompts = max(1, int(len(prompts) * float(_get(cfg, "prompts.heldout_fraction", 0.05))))
    if n_heldout_prompts >= len(prompts):
        raise CtrlgError(f"{len(prompts)} prompts are too few to hold out {n_heldout_prompts}")
    return prompts[:-n_heldout_prompts], prompts[-n_heldout_prompts:]


def _sampling_workers(value, device: str = "cpu") -> int:
    """``sampling.workers``: chunks sampled at once in threads of this process, one core each.
    ``auto`` (or None) = the cores this process may run on when the LM is on the CPU, 1 on an
    accelerator (one device runs one batch at a time well); a positive integer as given."""
    if value is None or value == "auto":
        if str(device) != "cpu":
            return 1
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        workers = int(value)
    except (TypeError, ValueError):
        workers = 0
    if workers < 1 or str(workers) != str(value).strip():
        raise CtrlgError(f"sampling.workers={value!r}: expected 'auto' or a positive integer")
    return workers


def _sampling_options(cfg: Mapping) -> dict:
    """The :func:`~ctrlg.hmm.sampling.sample_to_disk` settings that decide the training and the
    held-out samples (``sampling.length``, ``chunk_size``, ``batch_size``, ``sampler``, ``shard``)."""
    shard = _get(cfg, "sampling.shard")
    return dict(length=int(_get(cfg, "sampling.length", 32)),
                chunk_size=int(_get(cfg, "sampling.chunk_size", 256)),
                batch_size=int(_get(cfg, "sampling.batch_size", 32)),
                sampler=_get(cfg, "sampling.sampler", "inverse_cdf"),
                shard=tuple(shard) if shard else None)


SAMPLING_ENGINES = ("batched", "stream")


def _draw_samples(cfg: Mapping, model, tokenizer, samples: Path, seed: int) -> dict:
    """Step 1: sample the held-out set (with the LM's hidden states, seed + 1, from the held-out
    prompts) into ``samples/heldout`` and the training set (seed) into ``samples/train``.
    Cost: one LM forward step per sampled token, (N_train + N_heldout)·L steps in batches of
    ``sampling.batch_size``, ``sampling.workers`` chunks at once (the samples do not depend on
    it: chunks are seeded by their number); chunks already on disk are kept (resumable).

    ``sampling.engine: stream`` (one prompt only, e.g. ``prompts.format: bos``) draws them with
    the continuously batched sampler (:mod:`ctrlg.hmm.stream_sampling`, ``sampling.rows`` slots);
    the training chunks then carry hidden states only for the first ``lvd.sequences`` sequences
    (the LVD initialisation's data; all when null). Returns the sampler's throughput figures."""
    train_prompts, heldout_prompts = _split_prompts(cfg, build_prompts(cfg, tokenizer))
    engine = _get(cfg, "sampling.engine", "batched") or "batched"
    if engine not in SAMPLING_ENGINES:
        raise CtrlgError(f"sampling.engine must be one of {SAMPLING_ENGINES}, got {engine!r}")
    options = _sampling_options(cfg)
    if engine == "stream":
        if len(train_prompts) != 1 or len(heldout_prompts) != 1:
            raise CtrlgError(f"sampling.engine=stream samples one shared prompt (prompts.format=bos); "
                             f"this config has {len(train_prompts)} training prompts: use "
                             f"sampling.engine=batched")
        chunk = int(_get(cfg, "sampling.chunk_size", 65536))
        n_train = int(_get(cfg, "sampling.num_sequences", 4096))
        n_heldout = int(_get(cfg, "sampling.heldout_sequences", 256))
        lvd_sequences = _get(cfg, "lvd.sequences")
        lvd_sequences = n_train if lvd_sequences is None else min(int(lvd_sequences), n_train)
        common = dict(length=options["length"], chunk_size=chunk, shard=options["shard"],
                      rows=int(_get(cfg, "sampling.rows", 4096)))
        heldout = stream_sample_to_disk(model, tokenizer, heldout_prompts[0], samples / "heldout",
                                        num_sequences=n_heldout, seed=seed + 1,
                                        hidden_chunks=-(-n_heldout // chunk), **common)
        train = stream_sample_to_disk(model, tokenizer, train_prompts[0], samples / "train",
                                      num_sequences=n_train, seed=seed,
                                      hidden_chunks=-(-lvd_sequences // chunk), **common)
        return {"engine": "stream", "heldout": heldout, "train": train}
    options["workers"] = _sampling_workers(_get(cfg, "sampling.workers", "auto"),
                                           next(model.parameters()).device.type)
    sample_to_disk(model, tokenizer, heldout_prompts, samples / "heldout",
                   num_sequences=int(_get(cfg, "sampling.heldout_sequences", 256)), seed=seed + 1,
                   return_hidden=True, **options)
    sample_to_disk(model, tokenizer, train_prompts, samples / "train",
                   num_sequences=int(_get(cfg, "sampling.num_sequences", 4096)), seed=seed, **options)
    return {"engine": "batched"}


def _load_samples(cfg: Mapping, samples: Path) -> tuple[dict, torch.Tensor, dict]:
    """(train, valid, test): the training chunks (tokens, LM hidden states) and the held-out
    chunks split in halves: "valid" (tokens) drives the EM curve and early stopping with
    ``em.keep_best``, "test" (tokens, LM log-probs, hidden states, prompt indices) gives the
    reported figures. When the training chunks carry hidden states only in the first chunks
    (``sampling.engine: stream`` with ``lvd.sequences``), ``train["hidden"]`` covers those and
    ``train["lvd_tokens"]`` are their tokens. Cost: reading the chunks, O(N·L·d) for the hidden
    states."""
    meta_file = samples / "train" / "meta.json"
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    chunk_size = int(meta.get("chunk_size", _sampling_options(cfg)["chunk_size"]))

    def chunk_ids(key: str) -> list[int]:
        return list(range(-(-int(_get(cfg, key)) // chunk_size)))

    train_chunks = chunk_ids("sampling.num_sequences")
    hidden_chunks = int(meta.get("hidden_chunks", len(train_chunks)))
    if hidden_chunks >= len(train_chunks):
        train = load_chunks(samples / "train", ("tokens", "hidden"), chunks=train_chunks)
    else:
        train = load_chunks(samples / "train", ("tokens",), chunks=train_chunks)
        train.update(load_chunks(samples / "train", ("hidden",), chunks=train_chunks[:hidden_chunks]))
    train["lvd_tokens"] = train["tokens"][:train["hidden"].shape[0]]
    heldout = load_chunks(samples / "heldout", ("tokens", "logprob", "hidden", "prompt_index"),
                          chunks=chunk_ids("sampling.heldout_sequences"))
    half = heldout["tokens"].shape[0] // 2
    if half == 0:
        raise CtrlgError("sampling.heldout_sequences must be at least 2 (valid and test halves)")
    return train, heldout["tokens"][:half], {k: v[half:] for k, v in heldout.items()}


def extra_training_tokens(cfg: Mapping, tokenizer, length: int, pad_id: int) -> torch.Tensor | None:
    """``em.extra_texts``: texts the LM was adapted on, added to the EM data beside the LM's samples.

    Each line of the file that ``em.extra_select`` keeps (:mod:`ctrlg.data.commongen_targets`;
    ``bundled:<name>`` for a file in ``ctrlg/data/bundled``, e.g. the
    CommonGen train targets the adapter was trained on) becomes the continuation the adapted LM
    was taught to write after its BOS prompt (:func:`ctrlg.data.commongen_prompts.target_text`:
    " " + sentence + EOS), tokenised, cut to ``length`` tokens and EOS-padded like a sample.
    They join the EM data only: the LVD initialisation and the prior head use the LM's samples
    (their hidden states). The held-out figures stay on held-out LM samples, so whether the extra
    texts help the HMM model the *LM's* distribution is measured, not assumed. Returns
    ``[N_extra, length]`` token ids, or None when ``em.extra_texts`` is unset.
    Cost: tokenising N_extra lines."""
    source = _get(cfg, "em.extra_texts")
    if not source:
        return None
    path = data_path(str(source))
    if not path.is_file():
        raise CtrlgError(f"em.extra_texts: no file at {str(path)!r}")
    lines = read_prompts(path)
    lines = [lines[i] for i in selected_indices(lines, _get(cfg, "em.extra_select"))]
    limit = _get(cfg, "em.extra_limit")
    lines = lines[:int(limit)] if limit else lines
    out = torch.full((len(lines), length), pad_id, dtype=torch.long)
    encoded = tokenizer([target_text(line, tokenizer) for line in lines],
                        add_special_tokens=False)["input_ids"]
    for row, ids in enumerate(encoded):
        ids = ids[:length]
        out[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def _hmm_config(cfg: Mapping, model_name, tokenizer) -> dict:
    """The JSON config saved with the HMM: the tokenizer's name and fingerprint (checked when the
    HMM is loaded against an LM) and the whole training config."""
    return {
        "tokenizer_name": model_name or models.EMBEDDED_NAME,
        "tokenizer_hash": tokenizer_fingerprint(tokenizer),
        "training": json.loads(json.dumps(dict(cfg), default=str)),
    }


def _initial_hmm(cfg: Mapping, train: dict, vocab_size: int, eos_id: int, seed: int, config: dict,
                 device="cpu"):
    """Step 2: the LVD initialisation (:func:`ctrlg.hmm.lvd.lvd_init`: k-means of the LM's hidden
    states into ``hidden_size`` − 1 clusters + the EOS-padding state, counts from the cluster
    sequence; the k-means iterations on ``device``). Cost: O(kmeans_iters · N·L · d · h)."""
    return lvd_init(train["lvd_tokens"], train["hidden"],
                    int(_get(cfg, "hidden_size", 128)), vocab_size,
                    eos_token_id=eos_id, device=device,
                    pseudocount=float(_get(cfg, "lvd.pseudocount", _get(cfg, "em.pseudocount", 1.0))),
                    kmeans_iters=int(_get(cfg, "lvd.kmeans_iters", 20)), seed=seed, config=config,
                    emission_prior=_get(cfg, "em.emission_prior", "uniform"))


def _warm_start_hmm(name_or_folder: str, tokenizer, vocab_size: int, eos_id: int, config: dict):
    """Step 2 with ``init_hmm`` set: EM starts from an existing HMM instead of LVD (e.g. the
    shipped HMM re-fitted to the samples of a re-adapted LM: its states keep what they learnt
    from the larger sample they were distilled from, and EM moves them to the new LM's
    distribution). Its hidden size replaces ``hidden_size``; a quantised emission matrix is
    dequantised to float32 on load; the metrics' ``hmm_lvd_init`` is then this HMM's held-out LL.
    Its padding state (the one that emits the samples' EOS) is recorded as ``eos_pad_state`` /
    ``eos_token_id``, as LVD records it, so EM keeps that state's rows fixed and the sampler can
    check the EOS. Raises CtrlgError when its vocabulary differs from the LM's or no state emits
    the samples' EOS padding token."""
    hmm = _load_base_hmm(name_or_folder, tokenizer)
    if hmm.vocab_size != vocab_size:
        raise CtrlgError(f"init_hmm has a vocabulary of {hmm.vocab_size} tokens but the LM "
                         f"has {vocab_size}")
    padding_state = int(hmm.emission[:, eos_id].argmax())
    if float(hmm.emission[padding_state, eos_id]) < 0.5:
        raise CtrlgError(f"init_hmm has no state that emits the samples' padding token {eos_id} "
                         "with probability ≥ 0.5; was it distilled with another EOS?")
    hmm.config = {**config, "init_hmm": name_or_folder, "eos_pad_state": padding_state,
                  "eos_token_id": int(eos_id)}
    return hmm


def _train_em(cfg: Mapping, hmm, train_tokens: torch.Tensor, valid: torch.Tensor, device, seed: int):
    """Step 3: the mini-batch EM schedule ``em.schedule`` (:func:`ctrlg.hmm.em.baum_welch`), the
    validation log-likelihood recorded after every step; returns (HMM on the CPU, history).
    Cost per step: O(chunk tokens · h²) for the E-step, plus O(N_valid·L·h²) for the curve.
    ``em.matmul_precision: high`` lets float32 matmuls use TensorFloat-32 (CUDA) during EM only
    (about 4× the fp32 rate on an H100, ~1e-3 relative error per product); ``highest`` (the
    default) keeps full float32."""
    precision = str(_get(cfg, "em.matmul_precision", "highest") or "highest")
    if precision not in ("highest", "high", "medium"):
        raise CtrlgError(f"em.matmul_precision must be highest, high or medium, got {precision!r}")
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        hmm, history = _baum_welch(cfg, hmm, train_tokens, valid, device, seed)
    finally:
        torch.set_float32_matmul_precision(previous)
    return hmm.cpu(), history


def _baum_welch(cfg: Mapping, hmm, train_tokens: torch.Tensor, valid: torch.Tensor, device, seed: int):
    hmm, history = baum_welch(
        hmm, train_tokens, schedule=_get(cfg, "em.schedule", "10:1"),
        num_chunks=int(_get(cfg, "em.num_chunks", 1)), pseudocount=float(_get(cfg, "em.pseudocount", 1.0)),
        heldout_tokens=valid, batch_size=int(_get(cfg, "em.batch_size", 256)),
        backend=_get(cfg, "em.backend", "torch"), device=device, seed=seed,
        emission_prior=_get(cfg, "em.emission_prior", "uniform"),
        keep_best=bool(_get(cfg, "em.keep_best", False)),
        time_limit=_get(cfg, "em.time_limit_s"))
    return hmm, history


def _heldout_metrics(hmm, lvd_ll: float, train: dict, valid: torch.Tensor, test: dict,
                     vocab_size: int, eos_id: int, length: int, history) -> dict:
    """Step 4: the metrics dictionary: the test half's mean log-likelihood per token under the
    trained HMM, its LVD initialisation, the training unigram and the LM itself. Cost: one
    forward pass over the test tokens, O(N_test·L·h²)."""
    n_tokens = test["tokens"].numel()
    return {
        "hidden_size": hmm.hidden_size, "vocab_size": vocab_size,
        "train_sequences": int(train["tokens"].shape[0]),
        "valid_sequences": int(valid.shape[0]), "test_sequences": int(test["tokens"].shape[0]),
        "length": length,
        "heldout_ll_per_token": {
            "hmm": heldout_ll_per_token(hmm, test["tokens"]),
            "hmm_lvd_init": lvd_ll,
            "unigram": unigram_loglik(train["tokens"], test["tokens"], vocab_size),
            "lm": float(test["logprob"].double().sum() / n_tokens),
        },
        "em_best_step": history.best_step,
        "em_steps": len(history.step) - 1,
        "em_stopped_early": history.stopped_early,
        "eos_fraction_test": float((test["tokens"] == eos_id).float().mean()),
    }


def _head_config(cfg: Mapping, hmm_config: dict) -> dict:
    """The JSON config saved with a prior head: the tokenizer it was trained for, the LM (and
    adapter) whose features it reads, and the training config (from :func:`_hmm_config`)."""
    return {"tokenizer_name": hmm_config["tokenizer_name"],
            "tokenizer_hash": hmm_config["tokenizer_hash"],
            "lm_name": _get(cfg, "model.name") or models.EMBEDDED_NAME,
            "lm_adapter": _get(cfg, "model.adapter"),
            "training": hmm_config["training"]}


def _check_storage(cfg: Mapping) -> None:
    """Refuse, before hours of sampling and EM, an ``output`` section the save would refuse."""
    scheme = _get(cfg, "output.emission_quantization")
    k = topk_size(str(scheme)) if scheme else None     # CheckpointError naming a bad scheme
    if _get(cfg, "output.emission_support_min_count") is not None and k is None:
        raise CtrlgError(f"output.emission_support_min_count needs output.emission_quantization "
                         f"topk8-K (got {scheme!r})")


def _save_checkpoint(cfg: Mapping, hmm, train: dict, test: dict, metrics: dict, *, eos_ids,
                     hmm_config: dict, out_dir: Path):
    """Steps 5–6 (checkpoint): save the HMM in ``output.dtype``, reload it and record its test
    log-likelihood as saved; with ``head.enabled`` fit the prior head to the HMM exactly as it
    ships (after the dtype round trip) and save both; copy to ``output.copy_to``. Returns the
    HMM as written. Cost: the head's training epochs (:mod:`ctrlg.hmm.head_training`)."""
    dtype = getattr(torch, str(_get(cfg, "output.dtype", "float32")))
    storage = dict(dtype=dtype, emission_quantization=_get(cfg, "output.emission_quantization"))
    min_count = _get(cfg, "output.emission_support_min_count")
    if min_count is not None:   # topk8-K rows kept among the tokens the LM sampled ≥ min_count times
        storage["emission_support"] = support_from_tokens(train["tokens"], hmm.vocab_size,
                                                          int(min_count), always=tuple(eos_ids or ()))
    hmm.config["metrics"] = metrics["heldout_ll_per_token"]
    hmm.save(out_dir / "hmm", **storage)
    saved = type(hmm).load(out_dir / "hmm")
    metrics["heldout_ll_per_token"]["hmm_as_saved"] = heldout_ll_per_token(saved, test["tokens"])
    if _get(cfg, "head.enabled", True):
        with _timed(metrics["timings"], "head_s"):
            saved.prior_head, metrics["head"] = _train_head(cfg, saved, train, test, hmm.vocab_size,
                                                            eos_ids=eos_ids,
                                                            config=_head_config(cfg, hmm_config))
        saved.save(out_dir / "hmm", **storage)
        hmm = saved
    if _get(cfg, "output.copy_to"):
        hmm.save(_get(cfg, "output.copy_to"), **storage)
    return hmm


def _write_reports(out_dir: Path, history, metrics: dict) -> None:
    """Step 6 (reports): ``curve.json``, ``curve.png`` and ``metrics.json``; then fail loudly if
    any held-out log-likelihood is not finite."""
    (out_dir / "curve.json").write_text(json.dumps(history.as_dict(), indent=2))
    plot_curve(history.as_dict(), out_dir / "curve.png",
               title=f"EM, h={metrics['hidden_size']}, N={metrics['train_sequences']}, "
                     f"L={metrics['length']}")
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    for key, value in metrics["heldout_ll_per_token"].items():
        if not math.isfinite(value):
            raise CtrlgError(f"held-out log-likelihood of {key} is {value}")


def _load_base_hmm(name_or_folder: str, tokenizer):
    """``base_hmm``: an embedded HMM's name (:data:`ctrlg.hmm.EMBEDDED_HMMS`) or a checkpoint
    folder, checked against the tokenizer."""
    folder = embedded_hmm_path(name_or_folder) if name_or_folder in EMBEDDED_HMMS else Path(name_or_folder)
    return HMM.load(folder, tokenizer=tokenizer)


def train_head_for(cfg: Mapping, samples: Path, tokenizer, model_name, vocab_size: int,
                   out_dir: Path, timings: dict) -> dict:
    """The head-only pipeline (``base_hmm`` set): the HMM ``base_hmm`` stays frozen (no LVD, no
    EM); the LM-conditioned prior head is trained on the samples' LM features against it (step 5)
    and saved *apart from the HMM* in ``<output.dir>/prior_head`` (and ``output.copy_to``), its
    config naming the HMM's ``save_id`` (:meth:`ctrlg.hmm.model.HMM.attach_prior_head` checks
    it). Use: an HMM that models the sentences, read through the prompt of another LM (the
    supervised CommonGen LM, whose prompt names the concepts). Metrics: the test half's
    log-likelihood per token under the HMM, the unigram and the LM, and the prefix table."""
    hmm = _load_base_hmm(str(_get(cfg, "base_hmm")), tokenizer)
    sample_meta = json.loads((samples / "train" / "meta.json").read_text())
    eos_id, eos_ids = sample_meta["pad_token_id"], list(sample_meta["eos_token_ids"])
    if hmm.vocab_size != vocab_size:
        raise CtrlgError(f"base_hmm has a vocabulary of {hmm.vocab_size} tokens but the LM "
                         f"{vocab_size}; the head must read the LM the HMM was made for")
    train, valid, test = _load_samples(cfg, samples)
    n_tokens = test["tokens"].numel()
    metrics = {
        "base_hmm": str(_get(cfg, "base_hmm")), "hmm_save_id": hmm.config.get("save_id"),
        "hidden_size": hmm.hidden_size, "train_sequences": int(train["tokens"].shape[0]),
        "test_sequences": int(test["tokens"].shape[0]),
        "heldout_ll_per_token": {
            "hmm": heldout_ll_per_token(hmm, test["tokens"]),
            "unigram": unigram_loglik(train["tokens"], test["tokens"], vocab_size),
            "lm": float(test["logprob"].double().sum() / n_tokens)},
        "eos_fraction_test": float((test["tokens"] == eos_id).float().mean()),
        "timings": timings,
    }
    head_config = {**_head_config(cfg, _hmm_config(cfg, model_name, tokenizer)),
                   "hmm_save_id": hmm.config.get("save_id"), "base_hmm": str(_get(cfg, "base_hmm"))}
    with _timed(timings, "head_s"):
        head, metrics["head"] = _train_head(cfg, hmm, train, test, vocab_size, eos_ids=eos_ids,
                                            config=head_config)
    head.save(out_dir / "prior_head")
    if _get(cfg, "output.copy_to"):
        head.save(_get(cfg, "output.copy_to"))
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def distill(cfg: Mapping) -> dict:
    """Run the whole pipeline (module docstring); returns the metrics dictionary. With
    ``base_hmm`` set, only the prior head is trained (:func:`train_head_for`)."""
    _check_storage(cfg)
    seed = int(_get(cfg, "seed", 0))
    torch.manual_seed(seed)
    threads = _get(cfg, "threads")
    if threads:
        torch.set_num_threads(int(threads))
    out_dir = Path(_get(cfg, "output.dir", "outputs/distill"))
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    model_name, device = _get(cfg, "model.name"), _get(cfg, "device", "cpu")
    tokenizer = models.load_tokenizer(model_name)
    model = _sampling_model(cfg, model_name, device)
    samples = Path(_get(cfg, "sampling.dir", out_dir / "samples"))
    with _timed(timings, "sampling_s"):
        sampling_stats = _draw_samples(cfg, model, tokenizer, samples, seed)
    shard = _get(cfg, "sampling.shard")
    if shard or _get(cfg, "sampling.only", False):
        return {"samples": str(samples), "shard": shard, "timings": timings}
    V = int(model.get_output_embeddings().weight.shape[0])
    if _get(cfg, "base_hmm"):
        del model
        return train_head_for(cfg, samples, tokenizer, model_name, V, out_dir, timings)
    sample_meta = json.loads((samples / "train" / "meta.json").read_text())
    eos_id, eos_ids = sample_meta["pad_token_id"], list(sample_meta["eos_token_ids"])
    del model

    train, valid, test = _load_samples(cfg, samples)
    hmm_config = _hmm_config(cfg, model_name, tokenizer)
    with _timed(timings, "lvd_s"):
        if _get(cfg, "init_hmm"):
            hmm = _warm_start_hmm(str(_get(cfg, "init_hmm")), tokenizer, V, eos_id, hmm_config)
        else:
            hmm = _initial_hmm(cfg, train, V, eos_id, seed, hmm_config, device)
    lvd_ll = heldout_ll_per_token(hmm, test["tokens"])
    if not _get(cfg, "head.enabled", True):
        del train["hidden"], train["lvd_tokens"]
    em_tokens = train["tokens"]
    extra = extra_training_tokens(cfg, tokenizer, int(em_tokens.shape[1]), eos_id)
    if extra is not None:
        em_tokens = torch.cat([em_tokens, extra.to(em_tokens.dtype)])
    with _timed(timings, "em_s"):
        hmm, history = _train_em(cfg, hmm, em_tokens, valid, device, seed)

    metrics = _heldout_metrics(hmm, lvd_ll, train, valid, test, V, eos_id,
                               _sampling_options(cfg)["length"], history)
    metrics["timings"] = timings
    metrics["sampling"] = sampling_stats
    metrics["extra_sequences"] = 0 if extra is None else int(extra.shape[0])
    hmm = _save_checkpoint(cfg, hmm, train, test, metrics, eos_ids=eos_ids, hmm_config=hmm_config,
                           out_dir=out_dir)
    _write_reports(out_dir, history, metrics)
    return metrics
