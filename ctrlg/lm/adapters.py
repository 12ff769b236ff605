"""LoRA adapters of a base LM: the checkpoint format, the base fingerprint, merge at load.

An adapter folder is what ``peft`` reads (``adapter_model.safetensors`` + ``adapter_config.json``)
plus ``ctrlg_adapter.json``, which names the base LM, its **fingerprint** and the text format the
adapter was trained on (``prompt_style``, ``bos_token``: see :mod:`ctrlg.data.commongen_prompts`),
so decoding can use the same format. Every file is written into a staging folder and swapped in
at once (:func:`ctrlg.checkpoint.atomic_folder`), stamped with one save id.

Checksums. ``ctrlg_adapter.json`` also records (``checksums``) the SHA-256 of each tensor file
(``*.safetensors``, ``*.bin``) and of peft's ``adapter_config.json`` (its rank, α and target
modules decide what the weights do), written at save time; :func:`merge_adapter` verifies them
(:func:`ctrlg.checkpoint.check_checksums`) before peft reads anything, so a flipped bit is a
:class:`~ctrlg.errors.CheckpointError` naming the file instead of silently different weights.
Adapters saved before checksums (the shipped ones) record none and load as before; a record
that does not cover the weights file or is not a map of file names to SHA-256 digests is a
CheckpointError. (``adapter_config.json`` itself stays peft's own: nothing is added to it.)

Fingerprint. sha256 over the base's architecture fields (model type, vocabulary, hidden size,
layers) and the bytes of its input-embedding matrix and first and last decoder layers' weights,
rounded to bfloat16 — the same whether the base is loaded in float32 or bfloat16, different for
another checkpoint of the same architecture. Cost: one pass over ~30 M weights (~0.1 s).

Loading (:func:`merge_adapter`): the checksums are verified, then the fingerprint is compared
with the model's before anything is changed (a mismatch raises :class:`AdapterMismatchError`
naming both bases), then ``PeftModel.from_pretrained(model, folder).merge_and_unload()`` folds
W + (α/r)·B·A into each adapted weight once, so generation costs exactly what the base costs.

Named adapters shipped with ctrlg (:data:`EMBEDDED_ADAPTERS`) are resolved from
``ctrlg/assets/``; any other name is a folder path.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ctrlg.checkpoint import (atomic_folder, check_checksums, check_same_save, file_sha256,
                              new_save_id, recover)
from ctrlg.errors import CheckpointError, CtrlgError

__all__ = ["AdapterMismatchError", "EMBEDDED_ADAPTERS", "adapter_checksums", "adapter_info",
           "base_fingerprint", "merge_adapter", "resolve_adapter", "save_adapter"]

ASSETS = Path(__file__).resolve().parents[1] / "assets"
# name -> folder under ctrlg/assets (made by `python -m experiments.adapt`; each one's command and
# which pipeline uses it: docs/models.md)
EMBEDDED_ADAPTERS = {
    # not shipped (used by no default; re-create with their commands in docs/models.md): all
    # 39,069 train targets, 1 epoch; the 3,302 human-written (sentence-case) ones, 3 epochs
    "commongen": "adapter_smollm2_commongen",
    "commongen-human": "adapter_smollm2_commongen_human",
    # those captions capped at 20 per concept (1,807; data.select=sentence_case_balanced): the default
    "commongen-human-balanced": "adapter_smollm2_commongen_human_balanced",
    "commongen-supervised": "adapter_smollm2_commongen_supervised",
    # the story tasks (ctrlg.tasks.stories; configs/adapt_stories.yaml): plain LM on passages
    # (infilling), continuation of prefixes (editing, the editor), ILM's infilling format (baseline)
    "stories": "adapter_smollm2_stories",
    "stories-continue": "adapter_smollm2_stories_continue",
    "stories-ilm": "adapter_smollm2_stories_ilm",
}
META_FILE = "ctrlg_adapter.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_CONFIG_FILE = "adapter_config.json"
OWNED_FILES = {META_FILE, WEIGHTS_FILE, PEFT_CONFIG_FILE}
TENSOR_SUFFIXES = (".safetensors", ".bin")       # the files whose SHA-256 a save records


def adapter_checksums(folder: str | Path) -> dict[str, str]:
    """{file name: SHA-256 hex} of the files of an adapter folder that a save records: every
    tensor file (:data:`TENSOR_SUFFIXES`) and peft's ``adapter_config.json``."""
    folder = Path(folder)
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir())
            if p.is_file() and (p.name.endswith(TENSOR_SUFFIXES) or p.name == PEFT_CONFIG_FILE)}


class AdapterMismatchError(CheckpointError):
    """An adapter applied to a base LM other than the one it was trained on."""


def _decoder_layers(model) -> list[torch.nn.Module]:
    for path in ("model.layers", "transformer.h", "model.decoder.layers", "gpt_neox.layers"):
        node = model
        for part in path.split("."):
            node = getattr(node, part, None)
            if node is None:
                break
        if node is not None and len(node):
            return [node[0], node[len(node) - 1]]
    return []


def base_fingerprint(model) -> str:
    """sha256 (16 hex digits) of the base LM's architecture and a sample of its weights (module
    docstring). Computed on the *base*: call it before any adapter is merged."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    digest = hashlib.sha256()
    fields = {k: getattr(config, k, None) for k in
              ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
               "num_attention_heads", "intermediate_size")}
    digest.update(json.dumps(fields, sort_keys=True).encode())
    tensors = [base.get_input_embeddings().weight]
    for layer in _decoder_layers(base):
        tensors += [p for _, p in sorted(layer.named_parameters()) if "lora_" not in _]
    with torch.no_grad():
        for tensor in tensors:
            data = tensor.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16)
            digest.update(str(tuple(tensor.shape)).encode())
            digest.update(data.numpy().tobytes())
    return digest.hexdigest()[:16]


def resolve_adapter(name: str | Path) -> Path:
    """The folder of adapter ``name``: an embedded name (:data:`EMBEDDED_ADAPTERS`) or a path
    (a complete copy a killed save left beside an empty path is put back first:
    :func:`ctrlg.checkpoint.recover`)."""
    if isinstance(name, str) and name in EMBEDDED_ADAPTERS:
        folder = ASSETS / EMBEDDED_ADAPTERS[name]
        if not (folder / META_FILE).is_file():
            raise CheckpointError(f"the embedded adapter {name!r} is not in {folder}: it is not "
                                  "shipped; re-create it with its command in docs/models.md")
        return folder
    folder = Path(name).expanduser()
    recover(folder)                      # a save killed between its two renames (HMM.load's too)
    if not folder.is_dir():
        raise CheckpointError(f"adapter {str(name)!r} is neither an embedded adapter "
                              f"({', '.join(EMBEDDED_ADAPTERS)}) nor an existing folder")
    missing = sorted(f for f in OWNED_FILES if not (folder / f).is_file())
    if missing:
        raise CheckpointError(f"the adapter folder {folder} lacks {', '.join(missing)}; save "
                              "adapters with ctrlg.lm.adapters.save_adapter")
    return folder


def adapter_info(name: str | Path) -> dict[str, Any]:
    """The ``ctrlg_adapter.json`` of adapter ``name`` (base LM, fingerprint, text format, ...)."""
    folder = resolve_adapter(name)
    try:
        info = json.loads((folder / META_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{folder / META_FILE} is not valid JSON ({err})") from None
    if not isinstance(info, dict) or "base_fingerprint" not in info:
        raise CheckpointError(f"{folder / META_FILE} lacks 'base_fingerprint'")
    return info


def save_adapter(peft_model, folder: str | Path, *, base_name: str, base_fingerprint: str,
                 metadata: dict[str, Any] | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write ``peft_model``'s LoRA weights (in ``dtype``), its peft config and ctrlg's metadata
    into ``folder`` atomically. ``metadata`` (prompt style, BOS token, training config and
    figures) is stored beside the base's name and fingerprint, and so is the SHA-256 of each
    tensor file and of ``adapter_config.json`` (``checksums``, which :func:`merge_adapter`
    verifies)."""
    from peft import get_peft_model_state_dict

    folder = Path(folder)
    save_id = new_save_id()
    state = {k: v.detach().to("cpu", dtype).contiguous()
             for k, v in get_peft_model_state_dict(peft_model).items()}
    info = {"base_model": base_name, "base_fingerprint": base_fingerprint, "save_id": save_id,
            "dtype": str(dtype).replace("torch.", ""), **(metadata or {})}
    with atomic_folder(folder, owned=OWNED_FILES) as staging:
        save_file(state, str(staging / WEIGHTS_FILE), metadata={"save_id": save_id})
        peft_model.peft_config["default"].save_pretrained(str(staging))
        info["checksums"] = adapter_checksums(staging)
        (staging / META_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
    return folder


def _check_weights(folder: Path, info: dict) -> None:
    """CheckpointError unless the files match the checksums ``info`` records (none recorded:
    an adapter saved before checksums, accepted) and the weights file is a readable safetensors
    file of the same save as ``info``."""
    checksums = info.get("checksums")
    if isinstance(checksums, dict) and WEIGHTS_FILE not in checksums:
        raise CheckpointError(f"{folder / META_FILE}: 'checksums' records no SHA-256 for "
                              f"{WEIGHTS_FILE} (it names {sorted(map(str, checksums))}); save the "
                              "adapter again")
    check_checksums(folder, checksums, recorded_in=META_FILE)
    try:
        with safe_open(str(folder / WEIGHTS_FILE), "pt") as handle:
            stamp = (handle.metadata() or {}).get("save_id")
            if not list(handle.keys()):
                raise CheckpointError(f"{folder / WEIGHTS_FILE} holds no tensors")
    except (OSError, RuntimeError, ValueError, SafetensorError) as err:
        if isinstance(err, CtrlgError):
            raise
        raise CheckpointError(f"{folder / WEIGHTS_FILE} is truncated or corrupt ({err}); "
                              "re-create the adapter") from None
    check_same_save(folder, {WEIGHTS_FILE: stamp, META_FILE: info.get("save_id")})


def merge_adapter(model, name: str | Path):
    """``model`` with adapter ``name`` merged into its weights (module docstring); raises
    AdapterMismatchError when ``model`` is not the base the adapter was trained on, and
    CheckpointError when a file does not match the checksum ``ctrlg_adapter.json`` records
    (verified before peft reads the folder)."""
    from peft import PeftModel

    folder = resolve_adapter(name)
    info = adapter_info(folder)
    _check_weights(folder, info)
    found = base_fingerprint(model)
    if found != info["base_fingerprint"]:
        raise AdapterMismatchError(
            f"the adapter {str(name)!r} was trained on {info.get('base_model')!r} (fingerprint "
            f"{info['base_fingerprint']}) but the model given has fingerprint {found}; load the "
            f"base it names, or train an adapter for this model with `python -m experiments.adapt`")
    dtype = next(model.parameters()).dtype
    peft_model = PeftModel.from_pretrained(model, str(folder), is_trainable=False)
    merged = peft_model.merge_and_unload()
    return merged.to(dtype).eval()
