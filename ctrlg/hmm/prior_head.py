"""An LM-conditioned prior over the HMM's hidden states (Learning to Look Ahead, Yidou-Weng et al.
2025): a small network reads the LM's last-layer feature at the current position and predicts
the distribution of the HMM hidden state of the *next* generated token::

    log q(z | f_t) = log_softmax(W_2 · gelu(W_1 · f_t + b_1) + b_2 + W_0 · f_t + b_0)[z],  z ∈ [0, h)

``f_t`` ∈ R^d is the input of the LM's output embedding (``lm_head``) at the position whose logits
give the next token (for Hugging Face Llama: ``output.hidden_states[-1]``, after the final norm).
The guide uses ``q`` in place of the HMM's filtering prior, so p_hmm(α | x≤t, v) becomes aware of
the prompt and of what the LM is about to write while the HMM (and its backward tables) stay
shared. ``inner_size = 0`` keeps only the linear path W_0. Cost per row and token:
O(d·m + m·h + d·h) multiply-adds (m = ``inner_size``), tiny next to the LM step.

A head is saved beside its HMM as ``prior_head.safetensors`` + ``prior_head.json`` (never
pickle); both files are replaced atomically, and the JSON config (LM name, tokenizer
fingerprint, d, h, training config) is repeated in the safetensors metadata so a torn or mixed
pair is detected on load.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ctrlg.checkpoint import check_checksums, file_sha256
from ctrlg.errors import CheckpointError, VocabularyMismatchError
from ctrlg.vocab import tokenizer_fingerprint

__all__ = ["PriorHead", "HEAD_WEIGHTS_NAME", "HEAD_CONFIG_NAME", "has_prior_head"]

HEAD_WEIGHTS_NAME = "prior_head.safetensors"
HEAD_CONFIG_NAME = "prior_head.json"
HEAD_FORMAT = "ctrlg-prior-head"
HEAD_FORMAT_VERSION = 1


def has_prior_head(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a saved head (either of its two files)."""
    folder = Path(folder)
    return (folder / HEAD_WEIGHTS_NAME).exists() or (folder / HEAD_CONFIG_NAME).exists()


def _atomic_write(path: Path, write) -> None:
    """Write via ``write(tmp_path)`` to a temporary file in the same folder, then rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class PriorHead(torch.nn.Module):
    """Maps LM features [..., d] to log q(z | features) [..., h] (module docstring).

    Args:
        lm_hidden_size: d, the width of the LM feature (``lm_head.in_features``).
        hidden_size: h, the number of hidden states of the HMM the head serves.
        inner_size: width m of the non-linear path (0: a linear head).
        config: identity and training record; ``lm_name`` and ``tokenizer_hash``
            (:func:`ctrlg.hmm.tokenizer_fingerprint`) are checked on load.
    """

    def __init__(self, lm_hidden_size: int, hidden_size: int, *, inner_size: int = 256,
                 config: dict[str, Any] | None = None):
        super().__init__()
        for name, value in (("lm_hidden_size", lm_hidden_size), ("hidden_size", hidden_size)):
            if int(value) <= 0:
                raise CheckpointError(f"PriorHead {name} must be positive, got {value}")
        if int(inner_size) < 0:
            raise CheckpointError(f"PriorHead inner_size must be >= 0, got {inner_size}")
        self.lm_hidden_size, self.hidden_size, self.inner_size = int(lm_hidden_size), int(hidden_size), int(inner_size)
        self.linear = torch.nn.Linear(self.lm_hidden_size, self.hidden_size)
        if self.inner_size:
            self.inner = torch.nn.Linear(self.lm_hidden_size, self.inner_size)
            self.outer = torch.nn.Linear(self.inner_size, self.hidden_size)
            torch.nn.init.zeros_(self.outer.weight)  # starts as the linear head
            torch.nn.init.zeros_(self.outer.bias)
        self.config: dict[str, Any] = dict(config or {})

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """log q(z | features): [..., d] → [..., h], log-softmax-normalised over z (float32)."""
        if features.shape[-1] != self.lm_hidden_size:
            raise VocabularyMismatchError(
                f"PriorHead expects LM features of width {self.lm_hidden_size}, got shape "
                f"{tuple(features.shape)}; the head was trained for another LM")
        x = features.to(self.linear.weight.dtype)
        logits = self.linear(x)
        if self.inner_size:
            logits = logits + self.outer(torch.nn.functional.gelu(self.inner(x)))
        return torch.log_softmax(logits.float(), -1)

    def init_bias(self, log_prior: torch.Tensor) -> None:
        """Start from a feature-independent prior: zero the linear weights, bias = ``log_prior``
        [h] (e.g. the log of the HMM's average hidden-state marginal)."""
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.copy_(log_prior.to(self.linear.bias))

    # ------------------------------------------------------------------ checks
    def check(self, *, tokenizer=None, lm_hidden_size: int | None = None, hidden_size: int | None = None,
              source: str = "the PriorHead") -> None:
        """Raise VocabularyMismatchError unless the head fits this tokenizer, LM width d and HMM
        size h (each check only when the argument is given)."""
        if lm_hidden_size is not None and int(lm_hidden_size) != self.lm_hidden_size:
            raise VocabularyMismatchError(
                f"{source} reads LM features of width {self.lm_hidden_size} (LM "
                f"{self.config.get('lm_name', '?')!r}) but the LM given has width {int(lm_hidden_size)}; "
                f"train a head for this LM or use the LM it was trained on")
        if hidden_size is not None and int(hidden_size) != self.hidden_size:
            raise VocabularyMismatchError(
                f"{source} predicts {self.hidden_size} HMM hidden states but the HMM has "
                f"{int(hidden_size)}; a head only fits the HMM it was trained for")
        if tokenizer is not None:
            expected = self.config.get("tokenizer_hash")
            got = tokenizer_fingerprint(tokenizer)
            if expected and expected != got:
                raise VocabularyMismatchError(
                    f"{source} was trained for tokenizer {self.config.get('tokenizer_name', '?')!r} "
                    f"(vocabulary hash {expected}), which differs from the given tokenizer "
                    f"{getattr(tokenizer, 'name_or_path', '?')!r} (hash {got})")

    # ------------------------------------------------------------------ persistence
    def _full_config(self) -> dict[str, Any]:
        config = dict(self.config)
        config.update(format=HEAD_FORMAT, format_version=HEAD_FORMAT_VERSION,
                      lm_hidden_size=self.lm_hidden_size, hidden_size=self.hidden_size,
                      inner_size=self.inner_size)
        return config

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``folder/prior_head.safetensors`` and ``folder/prior_head.json`` (float32), each
        by an atomic rename; the config is also stored in the safetensors metadata, and the JSON
        records the weights' SHA-256 (``weights_sha256``), which :meth:`load` verifies."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config_text = json.dumps(json.loads(json.dumps(self._full_config(), default=str)),
                                 indent=2, sort_keys=True)
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in self.state_dict().items()}
        _atomic_write(folder / HEAD_WEIGHTS_NAME,
                      lambda tmp: save_file(tensors, tmp, metadata={"format": HEAD_FORMAT, "config": config_text}))
        with_sum = dict(json.loads(config_text), weights_sha256=file_sha256(folder / HEAD_WEIGHTS_NAME))
        _atomic_write(folder / HEAD_CONFIG_NAME,
                      lambda tmp: Path(tmp).write_text(json.dumps(with_sum, indent=2, sort_keys=True)))
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike, *, tokenizer=None, lm_hidden_size: int | None = None,
             hidden_size: int | None = None, device: str | torch.device = "cpu") -> "PriorHead":
        """Load a head written by :meth:`save`; CheckpointError on missing, corrupt or mismatched
        files, VocabularyMismatchError when ``tokenizer`` / ``lm_hidden_size`` (the LM's d) /
        ``hidden_size`` (the HMM's h) differ from what the head was trained for."""
        folder = Path(folder)
        weights_file, config_file = folder / HEAD_WEIGHTS_NAME, folder / HEAD_CONFIG_NAME
        missing = [f.name for f in (weights_file, config_file) if not f.is_file()]
        if missing:
            raise CheckpointError(f"{folder} holds no complete prior head: missing {missing} "
                                  f"(save one with PriorHead.save)")
        try:
            config = json.loads(config_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{config_file} is not valid JSON ({err}); re-save the head") from None
        if not isinstance(config, dict) or config.get("format") != HEAD_FORMAT:
            raise CheckpointError(f"{config_file} is not a prior-head config (format "
                                  f"{config.get('format') if isinstance(config, dict) else None!r})")
        checksum = config.pop("weights_sha256", None)        # heads saved before: none
        if checksum is not None:
            check_checksums(folder, {HEAD_WEIGHTS_NAME: checksum})
        try:
            tensors = {}
            with safe_open(str(weights_file), "pt") as handle:
                metadata = handle.metadata() or {}
                for key in handle.keys():
                    tensors[key] = handle.get_tensor(key)
        except (SafetensorError, OSError, RuntimeError, ValueError) as err:
            raise CheckpointError(f"{weights_file} is truncated or corrupt ({err}); re-save the head") from None
        try:
            stored = json.loads(metadata.get("config", "null"))
        except json.JSONDecodeError:
            stored = None
        if stored != config:
            raise CheckpointError(f"{weights_file} and {config_file} do not belong together (a torn or "
                                  f"mixed save); re-save the head")
        try:
            head = cls(int(config["lm_hidden_size"]), int(config["hidden_size"]),
                       inner_size=int(config.get("inner_size", 0)),
                       config={k: v for k, v in config.items()
                               if k not in ("format", "format_version", "lm_hidden_size", "hidden_size",
                                            "inner_size")})
            head.load_state_dict(tensors, strict=True)
        except (KeyError, TypeError, RuntimeError) as err:
            raise CheckpointError(f"{weights_file} does not match {config_file} ({err})") from None
        if not all(torch.isfinite(p).all() for p in head.parameters()):
            raise CheckpointError(f"{weights_file} holds NaN or infinite weights")
        head.check(tokenizer=tokenizer, lm_hidden_size=lm_hidden_size, hidden_size=hidden_size,
                   source=f"the prior head in {folder}")
        return head.to(device).eval()

    def extra_repr(self) -> str:
        return f"lm_hidden_size={self.lm_hidden_size}, hidden_size={self.hidden_size}, inner_size={self.inner_size}"
