"""Domain adaptation of a causal LM with LoRA (peft): the training loop, seeded and resumable.

Objective: the mean next-token negative log-likelihood of the *target* tokens of each example,

    L(θ) = − Σ_i Σ_{t ≥ s_i} log p_θ(x_{i,t} | x_{i,<t}) / Σ_i (n_i − s_i),

where example i is a prompt (positions < s_i, no loss) followed by a target (a CommonGen
sentence + EOS, :mod:`ctrlg.data.commongen_prompts`). Only the LoRA factors are trained: every
adapted linear map W (d_out × d_in) becomes W + (α/r)·B·A with A (r × d_in), B (d_out × r),
B = 0 at the start (Hu et al. 2021), so the model starts as the base.

Cost per step: one forward and backward pass of the LM over the batch's padded tokens
(≈ 6 · params · tokens FLOPs; bfloat16 autocast on CPU, where AVX512-BF16/AMX multiply ~4×
faster than float32) plus AdamW on the LoRA parameters (r · Σ (d_in + d_out), ~0.5–5 M).

Batches: the examples are shuffled by a generator seeded with (seed, epoch) and cut into
batches of ``batch_size`` examples after sorting each window of 64 batches by length (less
padding, same examples per epoch). Step k of epoch e is thus fixed by the seed, so a run resumed
from a checkpoint (LoRA weights, AdamW moments, scheduler step, written atomically every
``save_every`` steps as safetensors + JSON, never pickle) continues exactly where it stopped.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ctrlg.checkpoint import atomic_folder
from ctrlg.errors import CheckpointError, CtrlgError
from ctrlg.lm import models
from ctrlg.lm.adapters import base_fingerprint, save_adapter
from ctrlg.validation import config_value as get

__all__ = ["LoraSettings", "Example", "encode_examples", "epoch_batches", "collate",
           "mean_target_nll", "train_lora", "settings_from_config", "run_adaptation"]

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_STATE_TENSORS = "training_state.safetensors"
_STATE_JSON = "training_state.json"


@dataclass(frozen=True)
class Example:
    """Token ids of prompt + target; the loss covers positions ``start`` … ``len(ids) − 1``."""
    ids: tuple[int, ...]
    start: int


@dataclass
class LoraSettings:
    """The LoRA and optimisation settings (``configs/adapt.yaml``: ``lora.*``, ``train.*``)."""
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.05
    target_modules: Sequence[str] = DEFAULT_TARGETS
    lr: float = 2e-4
    weight_decay: float = 0.0
    warmup_fraction: float = 0.03
    epochs: int = 1
    batch_size: int = 32
    max_steps: int | None = None
    save_every: int = 100
    autocast: str | None = "bfloat16"
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def check(self) -> "LoraSettings":
        for name in ("rank", "epochs", "batch_size", "save_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CtrlgError(f"{name} must be a positive integer, got {value!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise CtrlgError(f"lr must be a positive number, got {self.lr!r}")
        if not 0 <= float(self.dropout) < 1:
            raise CtrlgError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.autocast not in (None, "bfloat16", "float16"):
            raise CtrlgError(f"autocast must be null, 'bfloat16' or 'float16', got {self.autocast!r}")
        return self


def encode_examples(tokenizer, prompts: Sequence[str], targets: Sequence[str]) -> list[Example]:
    """Tokenise prompt + target pairs (special tokens spelled in the text are recognised; the
    tokenizer adds none of its own). Prompt and target are encoded apart so that the loss starts
    exactly at the target's first token."""
    if len(prompts) != len(targets):
        raise CtrlgError(f"{len(prompts)} prompts but {len(targets)} targets")
    if not prompts:
        raise CtrlgError("no training examples")
    enc_p = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    enc_t = tokenizer(list(targets), add_special_tokens=False)["input_ids"]
    examples = []
    for p, t in zip(enc_p, enc_t):
        if not p or not t:
            raise CtrlgError("every example needs a non-empty prompt (at least BOS) and target")
        examples.append(Example(tuple(p) + tuple(t), len(p)))
    return examples


def epoch_batches(examples: Sequence[Example], batch_size: int, seed: int, epoch: int,
                  window: int = 64) -> list[list[int]]:
    """The batches (lists of example indices) of one epoch (module docstring)."""
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    order = torch.randperm(len(examples), generator=generator).tolist()
    span = batch_size * window
    batches = []
    for start in range(0, len(order), span):
        part = sorted(order[start:start + span], key=lambda i: len(examples[i].ids))
        batches += [part[k:k + batch_size] for k in range(0, len(part), batch_size)]
    shuffle = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffle]


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (−100 off the targets)."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, e in enumerate(examples):
        n = len(e.ids)
        ids[row, :n] = torch.tensor(e.ids)
        mask[row, :n] = 1
        labels[row, e.start:n] = ids[row, e.start:n]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _autocast(kind: str | None):
    if kind is None:
        return torch.autocast("cpu", enabled=False)
    return torch.autocast("cpu", dtype=getattr(torch, kind))


def _target_nll_sum(model, batch: dict, autocast: str | None) -> tuple[torch.Tensor, int]:
    """(Σ −log p of the target tokens, their number) for one collated batch.

    Only the positions from the first target onwards go through the output layer (``logits_to_keep``):
    a prompt's positions have no loss, and the [positions, V] logits with their softmax are a fifth
    of the step's work for a 49k-token vocabulary."""
    labels = batch["labels"]
    targets = (labels != -100).any(0).nonzero()
    first = int(targets[0]) if len(targets) else labels.shape[1] - 1
    keep = labels.shape[1] - max(first - 1, 0)            # logits at first-1 … end predict first …
    with _autocast(autocast):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       logits_to_keep=keep).logits
    labels = labels[:, labels.shape[1] - keep + 1:]
    logits = logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                            labels.reshape(-1), ignore_index=-100, reduction="sum")
    return nll, int((labels != -100).sum())


@torch.no_grad()
def mean_target_nll(model, examples: Sequence[Example], pad_id: int, *, batch_size: int = 32,
                    autocast: str | None = None, progress: bool | None = None) -> float:
    """Held-out mean negative log-likelihood per target token (nats); exp() is the perplexity."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    for k in tqdm(range(0, len(order), batch_size), desc="held-out NLL", leave=False,
                  disable=not (sys.stderr.isatty() if progress is None else progress)):
        nll, n = _target_nll_sum(model, collate([examples[i] for i in order[k:k + batch_size]],
                                                pad_id), autocast)
        total, count = total + float(nll), count + n
    model.train(was_training)
    return total / max(count, 1)


# ---------------------------------------------------------------------- resumable training state
def _save_state(folder: Path, model, optimizer, scheduler, step: int, losses: list[float],
                fingerprint: dict) -> None:
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())
    tensors = {}
    for name in names:
        tensors[f"param/{name}"] = params[name].detach().float().contiguous()
        state = optimizer.state.get(params[name], {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                tensors[f"{key}/{name}"] = state[key].detach().contiguous()
    meta = {"step": step, "losses": losses, "scheduler": scheduler.state_dict(),
            "optimizer_step": {n: float(optimizer.state.get(params[n], {}).get("step", 0)) for n in names},
            "fingerprint": fingerprint}
    with atomic_folder(folder, owned={_STATE_TENSORS, _STATE_JSON}) as staging:
        save_file(tensors, str(staging / _STATE_TENSORS))
        (staging / _STATE_JSON).write_text(json.dumps(meta, default=str))


def _load_state(folder: Path, model, optimizer, scheduler, fingerprint: dict) -> tuple[int, list]:
    """Restore a checkpoint written by :func:`_save_state`; (0, []) when there is none."""
    if not (folder / _STATE_JSON).is_file():
        return 0, []
    meta = json.loads((folder / _STATE_JSON).read_text())
    if meta.get("fingerprint") != json.loads(json.dumps(fingerprint, default=str)):
        raise CheckpointError(f"{folder} holds a training state of another configuration "
                              f"({meta.get('fingerprint')}); use a fresh output folder")
    tensors = load_file(str(folder / _STATE_TENSORS))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if not p.requires_grad:
                continue
            p.copy_(tensors[f"param/{name}"])
            if f"exp_avg/{name}" in tensors:
                optimizer.state[p] = {
                    "step": torch.tensor(meta["optimizer_step"][name]),
                    "exp_avg": tensors[f"exp_avg/{name}"].clone(),
                    "exp_avg_sq": tensors[f"exp_avg_sq/{name}"].clone()}
    scheduler.load_state_dict(meta["scheduler"])
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr          # the scheduler sets it only at its next step
    return int(meta["step"]), list(meta["losses"])


def _lora_model(model, settings: LoraSettings):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules), bias="none",
                        task_type="CAUSAL_LM")
    torch.manual_seed(settings.seed)       # A's initialisation
    return get_peft_model(model, config)


def train_lora(model, examples: Sequence[Example], pad_id: int, settings: LoraSettings, *,
               state_dir: str | Path, progress: bool | None = None, stop_after: int | None = None):
    """Train LoRA factors on ``examples`` (module docstring); returns (peft model, per-step
    losses). ``state_dir`` holds the resumable training state; an existing state of the same
    settings and data is continued. ``stop_after``: return after this many steps of the run
    (saving the state first), as an interrupted run would; a later call resumes."""
    from transformers import get_linear_schedule_with_warmup

    settings.check()
    state_dir = Path(state_dir)
    peft_model = _lora_model(model, settings)
    peft_model.train()
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=settings.weight_decay)
    per_epoch = -(-len(examples) // settings.batch_size)
    total = per_epoch * settings.epochs
    if settings.max_steps:
        total = min(total, int(settings.max_steps))
    scheduler = get_linear_schedule_with_warmup(optimizer, int(settings.warmup_fraction * total), total)
    fingerprint = {**asdict(settings), "num_examples": len(examples),
                   "num_tokens": sum(len(e.ids) for e in examples)}
    step, losses = _load_state(state_dir, peft_model, optimizer, scheduler, fingerprint)
    bar = tqdm(total=total, initial=step, desc="adapt", unit="step",
               disable=not (sys.stderr.isatty() if progress is None else progress))
    schedule: dict[int, list[list[int]]] = {}
    stop = total if stop_after is None else min(total, int(stop_after))
    try:
        while step < stop:
            epoch, k = divmod(step, per_epoch)
            if epoch not in schedule:
                schedule = {epoch: epoch_batches(examples, settings.batch_size, settings.seed, epoch)}
            batch_ids = schedule[epoch][k]
            torch.manual_seed(settings.seed * 7919 + step)          # dropout masks of this step
            nll, n = _target_nll_sum(peft_model, collate([examples[i] for i in batch_ids], pad_id),
                                     settings.autocast)
            loss = nll / max(n, 1)
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            losses.append(float(loss.detach()))
            bar.update(1)
            bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}")
            if step % settings.save_every == 0 or step == stop:
                _save_state(state_dir, peft_model, optimizer, scheduler, step, losses, fingerprint)
    finally:
        bar.close()
    peft_model.eval()
    return peft_model, losses


# ---------------------------------------------------------------------- one adaptation run
def settings_from_config(cfg) -> LoraSettings:
    """:class:`LoraSettings` from a config's ``lora.*``, ``train.*`` and ``seed``."""
    lora, train = dict(get(cfg, "lora", {}) or {}), dict(get(cfg, "train", {}) or {})
    return LoraSettings(rank=int(lora.get("rank", 8)), alpha=float(lora.get("alpha", 16)),
                        dropout=float(lora.get("dropout", 0.0)),
                        target_modules=tuple(lora.get("target_modules") or LoraSettings.target_modules),
                        lr=float(train.get("lr", 2e-4)),
                        weight_decay=float(train.get("weight_decay", 0.0)),
                        warmup_fraction=float(train.get("warmup_fraction", 0.03)),
                        epochs=int(train.get("epochs", 1)),
                        batch_size=int(train.get("batch_size", 32)),
                        max_steps=train.get("max_steps"), save_every=int(train.get("save_every", 100)),
                        autocast=train.get("autocast", "bfloat16"),
                        seed=int(get(cfg, "seed", 0))).check()


def run_adaptation(cfg, make_texts, meta: dict) -> dict:
    """One adaptation run, the same for every task (``python -m experiments.adapt``):

    1. loads the base LM (``model.name``; weights in ``train.model_dtype``, attention
       ``train.attention``) and its tokenizer;
    2. ``make_texts(tokenizer)`` → ((train prompts, targets), (held-out prompts, targets)), encoded
       by :func:`encode_examples` (the loss covers the targets);
    3. measures the held-out NLL per target token, trains LoRA (:func:`train_lora`, resumable
       from ``output.dir/state``), measures it again;
    4. saves the adapter (:func:`ctrlg.lm.adapters.save_adapter`, with ``meta`` — the text format
       — and these figures) to ``output.dir/adapter`` and ``output.copy_to``, ``metrics.json``
       and ``losses.json``.

    Returns the metrics dictionary."""
    if get(cfg, "threads"):
        torch.set_num_threads(int(get(cfg, "threads")))
    settings = settings_from_config(cfg)
    out_dir = Path(get(cfg, "output.dir", "outputs/adapt"))
    out_dir.mkdir(parents=True, exist_ok=True)
    name = get(cfg, "model.name")
    kwargs = {"attn_implementation": get(cfg, "train.attention")} if get(cfg, "train.attention") else {}
    model = models.load_model(name, dtype=getattr(torch, str(get(cfg, "train.model_dtype", "bfloat16"))),
                              **kwargs)
    tokenizer = models.load_tokenizer(name)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    fingerprint = base_fingerprint(model)
    train_texts, heldout_texts = make_texts(tokenizer)
    train, heldout = encode_examples(tokenizer, *train_texts), encode_examples(tokenizer, *heldout_texts)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    before = mean_target_nll(model, heldout, pad, autocast=settings.autocast)
    timings["heldout_s"] = time.perf_counter() - start
    start = time.perf_counter()
    peft_model, losses = train_lora(model, train, pad, settings, state_dir=out_dir / "state")
    timings["train_s"] = time.perf_counter() - start
    after = mean_target_nll(peft_model, heldout, pad, autocast=settings.autocast)
    metrics = {
        **{k: meta[k] for k in ("form", "prompt_style") if k in meta},
        "train_examples": len(train), "train_target_tokens": sum(len(e.ids) - e.start for e in train),
        "train_tokens": sum(len(e.ids) for e in train),
        "heldout_references": len(heldout),
        "heldout_nll_per_token": {"base": before, "adapted": after},
        "heldout_perplexity": {"base": math.exp(before), "adapted": math.exp(after)},
        "steps": len(losses), "final_train_loss_50": sum(losses[-50:]) / max(len(losses[-50:]), 1),
        "timings": timings,
    }
    full_meta = {**meta, "metrics": metrics, "training": json.loads(json.dumps(dict(cfg), default=str))}
    base_name = name or models.EMBEDDED_NAME
    save_adapter(peft_model, out_dir / "adapter", base_name=base_name, base_fingerprint=fingerprint,
                 metadata=full_meta)
    if get(cfg, "output.copy_to"):
        save_adapter(peft_model, get(cfg, "output.copy_to"), base_name=base_name,
                     base_fingerprint=fingerprint, metadata=full_meta)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out_dir / "losses.json").write_text(json.dumps(losses) + "\n")
    return metrics
