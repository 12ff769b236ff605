"""Distillation at scale: run ``ctrlg.hmm.distill.distill`` (LM samples → LVD init → Baum-Welch)
with a given hidden size h and number of training samples N, and compare the held-out
log-likelihood per token of the new HMM with the embedded one (``ctrlg.hmm.load_default_hmm``)
on the *same* held-out samples.

held-out LL per token = Σ_sequences log p_hmm(x) / (number of held-out tokens), EOS padding
included (the sampler's fixed-length, EOS-padded sequences; see ``ctrlg.hmm.sampling``). Also
recorded: the LVD initialisation, a unigram baseline and the LM itself on those samples, the
LM-conditioned prior head that ``distill`` trains with the HMM (held-out continuation LL after k
given tokens, filtering vs head), and the pipeline's timings (sampling, LVD, EM, head).

At ``--size full``: the embedded SmolLM2-135M-Instruct, h = 1024, N = 200,000 sequences of 32
tokens, the Triton E-step (the torch one when the kernel is missing), on CUDA. Sampling is
resumable: the samples are written in chunks under the output folder, so rerunning the same
command continues where an interrupted run stopped. At ``--size tiny``: a tiny random Llama with
a 64-word tokenizer, h = 4, N = 8 — the embedded HMM's vocabulary differs, so its row records
the reason instead of a number.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

__all__ = ["SIZES", "run", "config_for", "MARKDOWN_COLUMNS", "COMMONGEN_TRAIN_PROMPTS"]

#: CommonGen training concept lines (the embedded HMM's prompts); the bundled dev set otherwise.
COMMONGEN_TRAIN_PROMPTS = Path(__file__).resolve().parents[2] / "ctrlg" / "data" / "bundled" / "commongen.train.src_alpha.txt"

SIZES = {
    "tiny": dict(hidden_size=4, num_sequences=32, heldout_sequences=8, length=8, batch_size=8,
                 chunk_size=8, schedule=[[2, 1]], num_chunks=1, kmeans_iters=2),
    "full": dict(hidden_size=1024, num_sequences=200_000, heldout_sequences=2048, length=32,
                 batch_size=512, chunk_size=8192, schedule=[[10, 1], [5, 4], [5, 16], [5, 32]],
                 num_chunks=32, kmeans_iters=10),
}

MARKDOWN_COLUMNS = [
    ("model", "HMM", "{}"), ("hidden_size", "h", "{}"), ("train_sequences", "N", "{}"),
    ("heldout_ll_per_token", "held-out LL/token", "{:.4f}"), ("note", "note", "{}"),
]


def _prompt_lines(size: str) -> tuple[list[str] | None, str | None, str]:
    """(inline list, file, source description) of the prompts."""
    if size == "tiny":
        return [" ".join(f"w{i + j}" for j in range(3)) for i in range(2, 40, 3)], None, "tiny word lists"
    return None, str(COMMONGEN_TRAIN_PROMPTS), "bundled CommonGen train concept lines"


def config_for(size: str, device: torch.device, out_dir: Path, *, model_name: str | None,
               seed: int = 0, hidden_size: int | None = None, num_sequences: int | None = None,
               backend: str = "torch") -> tuple[dict, str]:
    """The ``distill`` config mapping (keys of configs/distill.yaml) and the prompts' source."""
    p = dict(SIZES[size])
    h = int(hidden_size or p["hidden_size"])
    N = int(num_sequences or p["num_sequences"])
    lines, file, source = _prompt_lines(size)
    cfg = {
        "seed": seed, "device": str(device), "threads": None, "hidden_size": h,
        "model": {"name": model_name, "chat_template": size != "tiny"},
        "prompts": {"file": file, "list": lines, "format": "commongen" if size != "tiny" else "raw",
                    "chat_template": size != "tiny", "limit": None, "heldout_fraction": 0.1 if size == "tiny" else 0.05},
        "sampling": {"num_sequences": N, "heldout_sequences": p["heldout_sequences"],
                     "length": p["length"], "batch_size": p["batch_size"],
                     "chunk_size": p["chunk_size"],
                     "dir": str(out_dir / f"samples_L{p['length']}_N{N}_seed{seed}")},
        "lvd": {"kmeans_iters": p["kmeans_iters"], "pseudocount": 1.0},
        "em": {"schedule": p["schedule"], "num_chunks": p["num_chunks"], "batch_size": 256,
               "pseudocount": 1.0, "backend": backend},
        "output": {"dir": str(out_dir / f"h{h}_N{N}_seed{seed}"), "dtype": "float32"},
    }
    return cfg, source


def _embedded_row(heldout_tokens: torch.Tensor, vocab_size: int) -> dict:
    """The embedded HMM on the same held-out samples (or the reason it cannot be compared)."""
    row = {"model": "embedded HMM", "hidden_size": None, "train_sequences": None,
           "heldout_ll_per_token": None}
    try:
        from ctrlg.hmm import load_default_hmm
        hmm = load_default_hmm()
    except Exception as err:  # not shipped yet, or unreadable
        row["note"] = f"unavailable: {type(err).__name__}: {err}"
        return row
    row["hidden_size"] = hmm.hidden_size
    training = hmm.config.get("training", {}) if isinstance(hmm.config, dict) else {}
    row["train_sequences"] = (training.get("sampling") or {}).get("num_sequences")
    if hmm.vocab_size != vocab_size:
        row["note"] = (f"not comparable: the embedded HMM has vocabulary {hmm.vocab_size}, "
                       f"the benchmark LM {vocab_size}")
        return row
    from ctrlg.hmm.em import forward_loglik

    row["heldout_ll_per_token"] = float(forward_loglik(hmm, heldout_tokens) / heldout_tokens.numel())
    row["note"] = "same held-out samples"
    return row


def _head_rows(head_metrics: dict | None, h: int, N: int) -> list[dict]:
    """The LM-conditioned prior head (trained by ``distill`` with ``head.enabled``, the default):
    held-out LL per real token of the continuation after k given tokens, HMM filtering vs HMM +
    head (:func:`ctrlg.hmm.head_training.prefix_loglik_table`)."""
    rows = []
    for entry in (head_metrics or {}).get("prefix_table", []):
        per_token = entry["per_real_token"]
        for key, name in (("hmm", "HMM filtering"), ("hmm_head", "HMM + prior head")):
            if key in per_token:
                rows.append({"model": f"{name}, after k = {entry['prefix_length']}", "hidden_size": h,
                             "train_sequences": N, "heldout_ll_per_token": per_token[key],
                             "note": f"per real token of the continuation, {entry['sequences']} sequences"})
    return rows


def run(size: str, device: torch.device, *, seed: int = 0, peak=None, out_dir: str | Path | None = None,
        hidden_size: int | None = None, num_sequences: int | None = None,
        model_name: str | None = None) -> dict:
    """Distil an HMM (module docstring) and compare held-out LL per token."""
    from ctrlg.hmm.distill import distill
    from ctrlg.hmm.sampling import load_chunks

    from benchmarks.gpu.fixtures import tiny_lm_folder

    out_dir = Path(out_dir if out_dir is not None else "outputs/gpu_distill")
    out_dir.mkdir(parents=True, exist_ok=True)
    if size == "tiny" and model_name is None:
        model_name = str(tiny_lm_folder(out_dir / "tiny_lm", vocab_size=64, seed=seed))
    backend = "torch"
    if device.type == "cuda":
        try:
            import ctrlg.kernels.em_estep  # noqa: F401
            backend = "triton"
        except ImportError:
            pass
    cfg, source = config_for(size, device, out_dir, model_name=model_name, seed=seed,
                             hidden_size=hidden_size, num_sequences=num_sequences, backend=backend)
    start = time.perf_counter()
    metrics = distill(cfg)
    seconds = time.perf_counter() - start
    heldout = load_chunks(Path(cfg["sampling"]["dir"]) / "heldout", ("tokens",))["tokens"]
    ll = metrics["heldout_ll_per_token"]
    h, N = metrics["hidden_size"], metrics["train_sequences"]
    rows = [
        {"model": "distilled HMM", "hidden_size": h, "train_sequences": N,
         "heldout_ll_per_token": ll["hmm"], "note": f"EM backend {backend}"},
        {"model": "its LVD initialisation", "hidden_size": h, "train_sequences": N,
         "heldout_ll_per_token": ll["hmm_lvd_init"], "note": "before EM"},
        {"model": "unigram", "hidden_size": None, "train_sequences": N,
         "heldout_ll_per_token": ll["unigram"], "note": "same training tokens"},
        {"model": "the LM itself", "hidden_size": None, "train_sequences": None,
         "heldout_ll_per_token": ll["lm"], "note": "log p_lm of its own samples"},
        _embedded_row(heldout, metrics["vocab_size"]),
    ]
    rows += _head_rows(metrics.get("head"), h, N)
    for row in rows[:4]:
        if not math.isfinite(row["heldout_ll_per_token"]):
            raise RuntimeError(f"non-finite held-out log-likelihood in {row}")
    checkpoint = Path(cfg["output"]["dir"]) / "hmm"
    size_bytes = sum(f.stat().st_size for f in checkpoint.glob("*") if f.is_file())
    return {"description": "distil an HMM for the LM; held-out LL per token vs the embedded HMM",
            "model": model_name or "smollm2-135m-instruct (embedded)", "prompts": source,
            "vocab_size": metrics["vocab_size"], "length": metrics["length"],
            "heldout_sequences": metrics["valid_sequences"] + metrics["test_sequences"], "em_backend": backend,
            "timings_s": {**metrics["timings"], "total_s": seconds},
            "checkpoint": str(checkpoint), "checkpoint_bytes": size_bytes,
            "rows": rows, "skipped": []}
