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
5. write ``<output.dir>/hmm/{model.safetensors,config.json}`` (and the same checkpoint to
   ``output.copy_to`` if set, e.g. the package's asset folder), ``curve.json``, ``curve.png`` and
   ``metrics.json``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping

import torch

from ctrlg import models
from ctrlg.data._files import bundled_path
from ctrlg.errors import CtrlgError
from ctrlg.hmm.em import baum_welch, forward_loglik, unigram_prior
from ctrlg.hmm.lvd import lvd_init
from ctrlg.hmm.sampling import commongen_prompts, load_chunks, read_prompts, sample_to_disk
from ctrlg.vocab import tokenizer_fingerprint

__all__ = ["distill", "build_prompts", "unigram_loglik", "plot_curve"]


def _get(cfg: Mapping, dotted: str, default=None):
    node: Any = cfg
    for part in dotted.split("."):
        if node is None or part not in node:
            return default
        node = node[part]
    return node


def build_prompts(cfg: Mapping, tokenizer) -> list[str]:
    """Prompts from ``prompts.file`` (or the inline list ``prompts.list``): ``format: commongen``
    turns concept lines into chat-template instructions, ``raw`` uses each line as is."""
    lines = list(_get(cfg, "prompts.list") or []) or read_prompts(
        _get(cfg, "prompts.file") or bundled_path("commongen.train.src_alpha.txt"))
    limit = _get(cfg, "prompts.limit")
    fmt = _get(cfg, "prompts.format", "commongen")
    if fmt == "commongen":
        prompts = commongen_prompts(lines, tokenizer if _get(cfg, "prompts.chat_template", True) else None)
    elif fmt == "raw":
        prompts = list(dict.fromkeys(lines))
    else:
        raise CtrlgError(f"prompts.format must be 'commongen' or 'raw', got {fmt!r}")
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


def distill(cfg: Mapping) -> dict:
    """Run the whole pipeline (module docstring); returns the metrics dictionary."""
    seed = int(_get(cfg, "seed", 0))
    torch.manual_seed(seed)
    threads = _get(cfg, "threads")
    if threads:
        torch.set_num_threads(int(threads))
    out_dir = Path(_get(cfg, "output.dir", "outputs/distill"))
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    model_name = _get(cfg, "model.name")
    device = _get(cfg, "device", "cpu")
    tokenizer = models.load_tokenizer(model_name)
    model = models.load_model(model_name, device=device)
    prompts = build_prompts(cfg, tokenizer)
    n_heldout_prompts = max(1, int(len(prompts) * float(_get(cfg, "prompts.heldout_fraction", 0.05))))
    if n_heldout_prompts >= len(prompts):
        raise CtrlgError(f"{len(prompts)} prompts are too few to hold out {n_heldout_prompts}")
    train_prompts, heldout_prompts = prompts[:-n_heldout_prompts], prompts[-n_heldout_prompts:]

    samples = Path(_get(cfg, "sampling.dir", out_dir / "samples"))
    L = int(_get(cfg, "sampling.length", 32))
    common = dict(length=L, chunk_size=int(_get(cfg, "sampling.chunk_size", 256)),
                  batch_size=int(_get(cfg, "sampling.batch_size", 32)))
    start = time.perf_counter()
    sample_to_disk(model, tokenizer, heldout_prompts, samples / "heldout",
                   num_sequences=int(_get(cfg, "sampling.heldout_sequences", 256)), seed=seed + 1,
                   return_hidden=False, **common)
    sample_to_disk(model, tokenizer, train_prompts, samples / "train",
                   num_sequences=int(_get(cfg, "sampling.num_sequences", 4096)), seed=seed, **common)
    timings["sampling_s"] = time.perf_counter() - start
    V = int(model.get_output_embeddings().weight.shape[0])
    eos_id = json.loads((samples / "train" / "meta.json").read_text())["pad_token_id"]
    del model

    def chunk_ids(key: str) -> list[int]:
        return list(range(-(-int(_get(cfg, key)) // common["chunk_size"])))

    train = load_chunks(samples / "train", ("tokens", "hidden"), chunks=chunk_ids("sampling.num_sequences"))
    heldout = load_chunks(samples / "heldout", ("tokens", "logprob"),
                          chunks=chunk_ids("sampling.heldout_sequences"))
    h = int(_get(cfg, "hidden_size", 128))
    pseudocount = float(_get(cfg, "em.pseudocount", 1.0))
    hmm_config = {
        "tokenizer_name": model_name or models.EMBEDDED_NAME,
        "tokenizer_hash": tokenizer_fingerprint(tokenizer),
        "training": json.loads(json.dumps(dict(cfg), default=str)),
    }
    start = time.perf_counter()
    hmm = lvd_init(train["tokens"], train["hidden"], h, V, eos_token_id=eos_id,
                   pseudocount=float(_get(cfg, "lvd.pseudocount", pseudocount)),
                   kmeans_iters=int(_get(cfg, "lvd.kmeans_iters", 20)), seed=seed, config=hmm_config,
                   emission_prior=_get(cfg, "em.emission_prior", "uniform"))
    timings["lvd_s"] = time.perf_counter() - start
    # the held-out samples are split in halves: "valid" drives the EM curve (and early stopping
    # with em.keep_best), "test" gives the reported figures
    half = heldout["tokens"].shape[0] // 2
    if half == 0:
        raise CtrlgError("sampling.heldout_sequences must be at least 2 (valid and test halves)")
    valid = heldout["tokens"][:half]
    test = {k: v[half:] for k, v in heldout.items()}
    lvd_ll = float(forward_loglik(hmm, test["tokens"]) / test["tokens"].numel())
    del train["hidden"]

    start = time.perf_counter()
    hmm, history = baum_welch(
        hmm, train["tokens"], schedule=_get(cfg, "em.schedule", "10:1"),
        num_chunks=int(_get(cfg, "em.num_chunks", 1)), pseudocount=pseudocount,
        heldout_tokens=valid, batch_size=int(_get(cfg, "em.batch_size", 256)),
        backend=_get(cfg, "em.backend", "torch"), device=device, seed=seed,
        emission_prior=_get(cfg, "em.emission_prior", "uniform"),
        keep_best=bool(_get(cfg, "em.keep_best", False)))
    timings["em_s"] = time.perf_counter() - start
    hmm = hmm.cpu()

    n_tokens = test["tokens"].numel()
    metrics = {
        "hidden_size": h, "vocab_size": V, "train_sequences": int(train["tokens"].shape[0]),
        "valid_sequences": int(valid.shape[0]), "test_sequences": int(test["tokens"].shape[0]),
        "length": L,
        "heldout_ll_per_token": {
            "hmm": float(forward_loglik(hmm, test["tokens"]) / n_tokens),
            "hmm_lvd_init": lvd_ll,
            "unigram": unigram_loglik(train["tokens"], test["tokens"], V),
            "lm": float(test["logprob"].double().sum() / n_tokens),
        },
        "em_best_step": history.best_step,
        "eos_fraction_test": float((test["tokens"] == eos_id).float().mean()),
        "timings": timings,
    }
    dtype = getattr(torch, str(_get(cfg, "output.dtype", "float32")))
    hmm.config["metrics"] = metrics["heldout_ll_per_token"]
    hmm.save(out_dir / "hmm", dtype=dtype)
    if _get(cfg, "output.copy_to"):
        hmm.save(_get(cfg, "output.copy_to"), dtype=dtype)
    saved = type(hmm).load(out_dir / "hmm")
    metrics["heldout_ll_per_token"]["hmm_as_saved"] = float(forward_loglik(saved, test["tokens"]) / n_tokens)
    (out_dir / "curve.json").write_text(json.dumps(history.as_dict(), indent=2))
    plot_curve(history.as_dict(), out_dir / "curve.png",
               title=f"EM, h={h}, N={metrics['train_sequences']}, L={L}")
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    for key, value in metrics["heldout_ll_per_token"].items():
        if not math.isfinite(value):
            raise CtrlgError(f"held-out log-likelihood of {key} is {value}")
    return metrics
