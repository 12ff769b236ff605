"""The hidden Markov model that approximates the LM (Ctrl-G §3, GeLaTo).

Generative process over token sequences x_1..x_n with hidden states z_t ∈ [0, h)::

    z_1 ~ initial,   z_{t+1} ~ transition[z_t, :],   x_t ~ emission[z_t, :]

Parameters are probabilities in float32: ``initial`` [h], ``transition`` [h, h] (rows sum to 1),
``emission`` [h, V] (rows sum to 1). ``log_prob`` runs the *scaled* forward algorithm
(Rabiner 1989, §V.A): the forward vector is renormalised at every step and the log of each
normaliser is accumulated, so it is numerically safe for any length.

Checkpoints are a safetensors file (``model.safetensors``) plus ``config.json`` (hidden size,
vocab size, tokenizer identity, training config, the SHA-256 of each tensor file); never pickle.
An optional LM-conditioned prior
(:class:`ctrlg.hmm.prior_head.PriorHead`) lives in the same folder; ``HMM.load`` attaches it as
``hmm.prior_head`` (None when the folder has none) and ``HMM.save`` writes it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from ctrlg.checkpoint import (atomic_folder, check_checksums, check_same_save, file_sha256,
                              new_save_id, recover)
from ctrlg.errors import (CheckpointError, ConstraintError, HMMParameterError,
                          VocabularyMismatchError)
from ctrlg.hmm.prior_head import HEAD_CONFIG_NAME, HEAD_WEIGHTS_NAME, PriorHead, has_prior_head
from ctrlg.hmm.quantize import dequantize_emission, quantize_emission, topk_size
from ctrlg.validation import as_token_ids, check_count, check_seed
from ctrlg.vocab import tokenizer_fingerprint

__all__ = ["HMM", "tokenizer_fingerprint"]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
FORMAT_VERSION = 1
# every file an HMM checkpoint folder may hold (a re-save drops the ones it does not rewrite)
CHECKPOINT_FILES = (WEIGHTS_NAME, CONFIG_NAME, HEAD_WEIGHTS_NAME, HEAD_CONFIG_NAME)


def _load_head(path: Path, hmm: "HMM", tokenizer, device):
    """The PriorHead saved beside the HMM in ``path`` (None when there is none), checked against
    the HMM's size, the tokenizer and the HMM weights it was saved with."""
    if not has_prior_head(path):
        return None
    head = PriorHead.load(path, tokenizer=tokenizer, hidden_size=hmm.hidden_size, device=device)
    expected = head.config.get("hmm_sha256")
    if expected and expected != file_sha256(path / WEIGHTS_NAME)[:16]:
        raise CheckpointError(
            f"the prior head in {path} was saved with other HMM weights than {path / WEIGHTS_NAME}; "
            f"re-save the HMM together with its head (hmm.prior_head = head; hmm.save(path))")
    return head


def _check_distribution(name: str, tensor: torch.Tensor, atol: float = 1e-3) -> None:
    if not torch.isfinite(tensor).all():
        raise HMMParameterError(f"HMM parameter '{name}' contains NaN or infinite values")
    if (tensor < 0).any():
        raise HMMParameterError(f"HMM parameter '{name}' has negative probabilities")
    sums = tensor.sum(-1, dtype=torch.float64)
    worst = (sums - 1).abs().max().item()
    if worst > atol:
        raise HMMParameterError(
            f"HMM parameter '{name}': rows must sum to 1, but one sums to "
            f"{sums.flatten()[(sums - 1).abs().flatten().argmax()].item():.6f}")


def _check_same_save(path: Path, config: dict, weights_file: Path) -> None:
    """CheckpointError when config.json and the weights come from different saves."""
    with safe_open(str(weights_file), framework="pt") as handle:
        weights_id = (handle.metadata() or {}).get("save_id")
    check_same_save(path, {CONFIG_NAME: config.get("save_id"), WEIGHTS_NAME: weights_id})


class HMM(torch.nn.Module):
    """A discrete HMM with probability-space parameters (see module docstring).

    Use :meth:`from_params` to build one; ``hmm.initial``, ``hmm.transition`` and
    ``hmm.emission`` are float32 buffers that move with ``hmm.to(device)``.
    """

    def __init__(self, initial: torch.Tensor, transition: torch.Tensor, emission: torch.Tensor,
                 config: dict[str, Any] | None = None):
        super().__init__()
        self.register_buffer("initial", initial)
        self.register_buffer("transition", transition)
        self.register_buffer("emission", emission)
        self.config: dict[str, Any] = dict(config or {})
        self.prior_head = None  # an optional ctrlg.hmm.prior_head.PriorHead (saved with the HMM)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_params(cls, initial, transition, emission, *, config: dict[str, Any] | None = None,
                    normalize: bool = False, atol: float = 1e-3) -> "HMM":
        """Build from probabilities ``initial`` [h], ``transition`` [h, h], ``emission`` [h, V].

        Raises HMMParameterError on NaN/negative entries, bad shapes, or rows that do not sum to 1
        (within ``atol``). Rows are renormalised in float64 to remove rounding; with
        ``normalize=True`` arbitrary non-negative rows are accepted and normalised.
        """
        tensors = {}
        for name, value in (("initial", initial), ("transition", transition), ("emission", emission)):
            t = torch.as_tensor(value)
            if not t.is_floating_point():
                t = t.double()
            tensors[name] = t
        pi, A, B = tensors["initial"], tensors["transition"], tensors["emission"]
        if pi.ndim != 1:
            raise HMMParameterError(f"initial must be [h], got shape {tuple(pi.shape)}")
        h = pi.shape[0]
        if A.shape != (h, h):
            raise HMMParameterError(f"transition must be [{h}, {h}], got shape {tuple(A.shape)}")
        if B.ndim != 2 or B.shape[0] != h:
            raise HMMParameterError(f"emission must be [{h}, V], got shape {tuple(B.shape)}")
        for name, t in tensors.items():
            if normalize:
                if not torch.isfinite(t).all() or (t < 0).any():
                    raise HMMParameterError(f"HMM parameter '{name}' has NaN, infinite or negative values")
                if (t.sum(-1) <= 0).any():
                    raise HMMParameterError(f"HMM parameter '{name}' has an all-zero row")
            else:
                _check_distribution(name, t, atol)
        out = [(t.double() / t.double().sum(-1, keepdim=True)).float() for t in (pi, A, B)]
        return cls(*out, config=config)

    # ------------------------------------------------------------------ properties
    @property
    def hidden_size(self) -> int:
        return int(self.initial.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.emission.shape[1])

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def log_prob(self, ids, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        """log p_hmm(x_1:n) for each row of ``ids`` [B, n] (scaled forward algorithm).

        ``mask`` [B, n] (optional, bool) marks real tokens; masked positions (a right-padded
        suffix) contribute nothing, so rows of different lengths can share a batch.
        Returns float32 [B] (accumulated in float64).
        """
        ids = as_token_ids(ids, "log_prob ids", vocab_size=self.vocab_size,
                           device=self.emission.device)
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2:
            raise ConstraintError(f"log_prob ids must be [B, n] or [n], got shape {tuple(ids.shape)}")
        if mask is not None:
            mask = torch.as_tensor(mask, device=ids.device)
            if mask.dtype != torch.bool or mask.shape != ids.shape:
                raise ConstraintError(f"mask must be a bool tensor of shape {tuple(ids.shape)}, got "
                                      f"dtype {mask.dtype} and shape {tuple(mask.shape)}")
        B, n = ids.shape
        total = torch.zeros(B, dtype=torch.float64, device=ids.device)
        if n == 0:
            return total.float()
        if mask is None:
            mask = torch.ones(B, n, dtype=torch.bool, device=ids.device)
        emission_t = self.emission.T  # [V, h]
        alpha = self.initial.expand(B, -1) * emission_t[ids[:, 0]]
        for t in range(n):
            if t > 0:
                step = (alpha @ self.transition) * emission_t[ids[:, t]]
                alpha = torch.where(mask[:, t, None], step, alpha)
            norm = alpha.sum(-1)
            keep = mask[:, t]
            safe = torch.where(keep, norm, torch.ones_like(norm))
            total += torch.where(keep, safe.double().log(), torch.zeros_like(total))
            alpha = alpha / safe.clamp_min(torch.finfo(alpha.dtype).tiny)[:, None]
        return total.float()

    @torch.no_grad()
    def sample(self, num_samples: int, length: int, *, seed: int | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw ``num_samples`` token sequences of ``length`` tokens: int64 [num_samples, length]."""
        num_samples = check_count("num_samples", num_samples)
        length = check_count("length", length)
        if num_samples == 0:
            return torch.empty(0, length, dtype=torch.long, device=self.emission.device)
        if generator is None:
            generator = torch.Generator(device=self.emission.device)
            if seed is not None:
                generator.manual_seed(check_seed(seed))
        out = torch.empty(num_samples, length, dtype=torch.long, device=self.emission.device)
        z = torch.multinomial(self.initial.expand(num_samples, -1), 1, generator=generator)[:, 0]
        for t in range(length):
            out[:, t] = torch.multinomial(self.emission[z], 1, generator=generator)[:, 0]
            if t + 1 < length:
                z = torch.multinomial(self.transition[z], 1, generator=generator)[:, 0]
        return out

    # ------------------------------------------------------------------ vocabulary checks
    def check_vocab(self, vocab_size: int | None = None, *, tokenizer=None, what: str = "LM") -> None:
        """Raise VocabularyMismatchError unless this HMM fits a vocabulary of ``vocab_size`` tokens
        (an LM's output size) and, if given, the ``tokenizer`` (or :class:`ctrlg.Vocabulary`) it
        was distilled with."""
        if vocab_size is not None and int(vocab_size) != self.vocab_size:
            raise VocabularyMismatchError(
                f"the HMM has vocabulary size {self.vocab_size} but the {what} has {int(vocab_size)}")
        if tokenizer is not None:
            expected = self.config.get("tokenizer_hash")
            if expected and expected != tokenizer_fingerprint(tokenizer):
                raise VocabularyMismatchError(
                    f"the HMM was distilled for tokenizer {self.config.get('tokenizer_name', '?')!r} "
                    f"(vocabulary hash {expected}), which differs from the given tokenizer "
                    f"{getattr(tokenizer, 'name_or_path', None) or getattr(tokenizer, 'name', '?')!r} "
                    f"(hash {tokenizer_fingerprint(tokenizer)})")

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike, *, dtype: torch.dtype = torch.float32,
             emission_quantization: str | None = None,
             emission_support: torch.Tensor | None = None) -> Path:
        """Write ``path/model.safetensors``, ``path/config.json`` and the attached ``prior_head``
        (if any) atomically: all are written into a staging folder that then replaces ``path``
        (:func:`ctrlg.checkpoint.atomic_folder`; a stale head in ``path`` disappears with it), and
        the HMM's two files carry the same save id, which :meth:`load` checks; the head records
        the hash of the weights it was saved with, and ``config.json`` the SHA-256 of every
        tensor file (``checksums``), which :meth:`load` verifies. A kill at any point leaves
        the old or the new checkpoint at ``path`` (:mod:`ctrlg.checkpoint`). ``dtype=torch.bfloat16`` halves the file
        (parameters are renormalised in float32 on load); ``emission_quantization="log8"`` or
        ``"normq8"`` stores the emission matrix in 8 bits (:mod:`ctrlg.hmm.quantize`);
        ``"topk8-K"`` keeps each state's K most likely tokens, among ``emission_support`` (bool
        [V]) when given."""
        path = Path(path)
        if emission_quantization is not None:
            topk_size(emission_quantization)       # CheckpointError for a bad scheme (5, ["log8"])
        if emission_support is not None and not emission_quantization:
            raise CheckpointError("an emission support needs a topk8-K emission_quantization "
                                  "(without one every token is stored)")
        save_id = new_save_id()
        names = ("initial", "transition") + (() if emission_quantization else ("emission",))
        tensors = {name: getattr(self, name).detach().to("cpu", dtype).contiguous()
                   for name in names}
        if emission_quantization:
            tensors.update(quantize_emission(self.emission, emission_quantization, emission_support))
        config = dict(self.config)
        if emission_support is not None:
            config["emission_support_size"] = int(torch.as_tensor(emission_support).sum())
        config.update(format_version=FORMAT_VERSION, hidden_size=self.hidden_size,
                      vocab_size=self.vocab_size, dtype=str(dtype).replace("torch.", ""),
                      save_id=save_id, emission_quantization=emission_quantization)
        with atomic_folder(path, owned=CHECKPOINT_FILES) as staging:
            save_file(tensors, str(staging / WEIGHTS_NAME),
                      metadata={"format": "ctrlg-hmm", "save_id": save_id})
            checksums = {WEIGHTS_NAME: file_sha256(staging / WEIGHTS_NAME)}
            if self.prior_head is not None:
                self.prior_head.config["hmm_sha256"] = checksums[WEIGHTS_NAME][:16]
                self.prior_head.save(staging)
                checksums[HEAD_WEIGHTS_NAME] = file_sha256(staging / HEAD_WEIGHTS_NAME)
            config["checksums"] = checksums
            (staging / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, *, tokenizer=None, device: str | torch.device = "cpu") -> "HMM":
        """Load a checkpoint written by :meth:`save`. With ``tokenizer``, check it matches.
        CheckpointError for a missing, truncated, corrupt (a tensor file whose SHA-256 differs
        from the one ``config.json`` records; checkpoints saved before checksums load without)
        or inconsistent checkpoint (bad quantised data or scheme). A save killed between its
        two renames is recovered first (:func:`ctrlg.checkpoint.recover`)."""
        path = Path(path)
        recover(path)                         # a save killed between its two renames
        config_file, weights_file = path / CONFIG_NAME, path / WEIGHTS_NAME
        if not config_file.is_file() or not weights_file.is_file():
            raise CheckpointError(f"{path} is not an HMM checkpoint: expected {CONFIG_NAME} and {WEIGHTS_NAME}")
        try:
            config = json.loads(config_file.read_text())
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{config_file} is not valid JSON ({err})") from None
        if not isinstance(config, dict):
            raise CheckpointError(f"{config_file} must hold a JSON object (hidden_size, vocab_size, "
                                  f"...), got a {type(config).__name__}; save the HMM again")
        try:
            _check_same_save(path, config, weights_file)      # the clearest error for a mix
            check_checksums(path, config.get("checksums"))
            tensors = load_file(str(weights_file))
        except (SafetensorError, OSError, RuntimeError) as err:
            raise CheckpointError(f"{weights_file} is truncated or corrupt ({err})") from None
        if config.get("emission_quantization") is not None:
            tensors["emission"] = dequantize_emission(tensors, config["emission_quantization"])
        missing = {"initial", "transition", "emission"} - tensors.keys()
        if missing:
            raise CheckpointError(f"{weights_file} lacks tensors {sorted(missing)}")
        h, V = config.get("hidden_size"), config.get("vocab_size")
        if tuple(tensors["emission"].shape) != (h, V):
            raise CheckpointError(
                f"{weights_file}: emission has shape {tuple(tensors['emission'].shape)} but "
                f"{CONFIG_NAME} says hidden_size={h}, vocab_size={V}")
        tolerance = 1e-3 if tensors["transition"].dtype in (torch.float32, torch.float64) else 5e-2
        try:
            hmm = cls.from_params(tensors["initial"].double(), tensors["transition"].double(),
                                  tensors["emission"].double(), config=config, atol=tolerance)
        except HMMParameterError as err:
            raise CheckpointError(f"{weights_file}: {err}") from None
        if tokenizer is not None:
            hmm.check_vocab(tokenizer=tokenizer)
        hmm.prior_head = _load_head(path, hmm, tokenizer, device)
        return hmm.to(device)

    def attach_prior_head(self, folder: str | os.PathLike, *, tokenizer=None,
                          device: str | torch.device = "cpu") -> PriorHead:
        """Load a prior head saved *apart from* this HMM (``PriorHead.save``; e.g. the head that
        reads another LM's prompt, ``python -m experiments.distill base_hmm=...``) and attach it as
        ``self.prior_head``. CheckpointError unless the head was trained against this very
        checkpoint (its ``hmm_save_id`` equals this HMM's ``save_id``); VocabularyMismatchError
        when its tokenizer or h differ."""
        head = PriorHead.load(folder, tokenizer=tokenizer, hidden_size=self.hidden_size, device=device)
        expected, got = head.config.get("hmm_save_id"), self.config.get("save_id")
        if not expected or expected != got:
            raise CheckpointError(
                f"the prior head in {folder} was trained against the HMM with save_id {expected!r}, "
                f"not this one ({got!r}); train a head for this HMM with `python -m "
                f"experiments.distill base_hmm=<this HMM> ...`")
        self.prior_head = head
        return head

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, vocab_size={self.vocab_size}"
