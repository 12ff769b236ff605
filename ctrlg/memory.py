"""Up-front memory estimates of a generation request, checked against the memory available.

A request whose working set can be told before any work is refused with the estimate
(:class:`ctrlg.errors.InsufficientMemoryError`) instead of being left to the system's
out-of-memory killer, which would take a whole server (every user of the editor) down with it.

The estimates (bytes; rows R = sequences decoded together, prompt P, budget n, suffix σ,
vocabulary V = the LM's logits width, float32 logits):

* guide tables (:class:`ctrlg.guide.tables.GuideTables`): Ŵ float32 [n+1, S, h], c float64
  [n+1, S] and F bool [n+1, S] → (n+1)·S·(4h + 9) for S DFA states and h hidden states; with
  logical masking (no HMM) F alone, (n+1)·S — checked by the processor before either is built;
* decoding (``model.generate``): the KV cache 2·L·R·(P+n)·kv_heads·head_dim·(dtype bytes) for
  L layers, plus :data:`STEP_COPIES` float32 [R, V] per step (logits, processed scores,
  probabilities, the top-p sort) and, for an LM that computes logits at every prompt position,
  R·P·V·4 for the first step;
* the rescoring pass (:func:`ctrlg.sampler.lm_log_likelihood`, chunks of ≤ 16 candidates):
  3 float32 [min(R, 16), P+n+σ, V] (logits, their float copy, log-softmax).

Decoding and rescoring do not overlap, so the LM's share is the larger of the two; the guide
tables live alongside either. Each device's share is compared with what that device has
available: :func:`available_bytes` (psutil's ``available``, else ``MemAvailable`` of
``/proc/meminfo``; ``torch.cuda.mem_get_info`` on a GPU). When the amount cannot be read the
check passes. The estimates leave out the weights (already loaded) and small per-row state.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ctrlg.errors import InsufficientMemoryError

__all__ = ["available_bytes", "guide_table_bytes", "feasibility_bytes", "lm_generation_bytes", "Estimate",
           "check_fits", "check_lm_fits", "check_tables_fit", "format_bytes", "STEP_COPIES",
           "SCORE_CHUNK"]

#: float32 [rows, V] arrays alive during one decoding step.
STEP_COPIES = 4
#: candidates per forward pass of the rescoring pass (``lm_log_likelihood``'s batch size).
SCORE_CHUNK = 16


def available_bytes(device: str | torch.device | None = None) -> int | None:
    """Bytes that can still be allocated on ``device`` (default: host memory), or None when
    the system does not say."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def format_bytes(n: float) -> str:
    """``1536`` → ``1.5 KiB``; binary units up to TiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass
class Estimate:
    """Named parts of a working set, each on a device; ``alternatives`` groups parts of which
    only the largest is alive at a time (decoding vs rescoring)."""

    parts: list[tuple[str, int, str]]             # (label, bytes, device)
    alternatives: tuple[tuple[str, ...], ...] = ()

    def per_device(self) -> dict[str, int]:
        """Peak bytes per device: the sum of the parts, counting only the largest of each
        group of alternatives."""
        total: dict[str, int] = {}
        skipped = set()
        for group in self.alternatives:
            members = [p for p in self.parts if p[0] in group]
            if members:
                biggest = max(members, key=lambda p: p[1])
                skipped.update(p[0] for p in members if p is not biggest)
        for label, size, device in self.parts:
            if label not in skipped:
                total[device] = total.get(device, 0) + int(size)
        return total

    def describe(self) -> str:
        return ", ".join(f"{label} {format_bytes(size)}" for label, size, _ in self.parts)


def feasibility_bytes(num_states: int, max_new_tokens: int) -> int:
    """(n+1)·S: the feasibility table F (bool) that logical masking keeps."""
    return (int(max_new_tokens) + 1) * int(num_states)


def guide_table_bytes(num_states: int, hidden_size: int, max_new_tokens: int) -> int:
    """(n+1)·S·(4h + 9): Ŵ float32, the scales c float64 and the feasibility F (bool)."""
    return (int(max_new_tokens) + 1) * int(num_states) * (4 * int(hidden_size) + 9)


def _text_config(model):
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return config


def _kv_cache_bytes(model, rows: int, length: int) -> int:
    """2·L·rows·length·kv_heads·head_dim·(dtype bytes); 0 for an LM without a KV cache config."""
    config = _text_config(model)
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not layers or not heads or not hidden:
        return 0
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    try:
        element = next(model.parameters()).element_size()
    except (StopIteration, AttributeError):
        element = 4
    return 2 * int(layers) * rows * length * int(kv_heads) * int(head_dim) * element


def _keeps_last_logits_only(model) -> bool:
    """Whether ``generate``'s first step computes logits at the last position only."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def lm_generation_bytes(model, rows: int, prompt_length: int, max_new_tokens: int, *,
                        vocab_size: int, scored_rows: int = 0, suffix_length: int = 0
                        ) -> list[tuple[str, int]]:
    """The LM's parts (module docstring): ``("decoding", ...)`` and, when ``scored_rows`` > 0,
    ``("rescoring", ...)``."""
    length = int(prompt_length) + int(max_new_tokens)
    decoding = _kv_cache_bytes(model, rows, length) + rows * vocab_size * 4 * STEP_COPIES
    if not _keeps_last_logits_only(model):
        decoding += rows * int(prompt_length) * vocab_size * 4
    parts = [("decoding", decoding)]
    if scored_rows > 0:
        chunk = min(int(scored_rows), SCORE_CHUNK)
        parts.append(("rescoring", 3 * chunk * (length + int(suffix_length)) * vocab_size * 4))
    return parts


def check_fits(estimate: Estimate, what: str, advice: str) -> None:
    """Raise :class:`InsufficientMemoryError` when the peak of ``estimate`` on some device
    exceeds what that device has available; the message names ``what``, the estimate, its
    parts, the memory available and ``advice``."""
    for device, need in estimate.per_device().items():
        have = available_bytes(device)
        if have is not None and need > have:
            raise InsufficientMemoryError(
                f"{what} needs an estimated {format_bytes(need)} on {device} "
                f"({estimate.describe()}) but only {format_bytes(have)} is available: {advice}")


def _device_of(module) -> str:
    try:
        device = next(module.parameters()).device
    except (StopIteration, AttributeError):
        return "cpu"
    return str(device)


def check_lm_fits(model, *, rows: int, prompt_length: int, max_new_tokens: int, vocab_size: int,
                  scored_rows: int = 0, suffix_length: int = 0, what: str, advice: str) -> None:
    """:func:`check_fits` for the LM's decoding and rescoring (:func:`lm_generation_bytes`),
    which do not overlap: the larger of the two counts."""
    parts = lm_generation_bytes(model, rows, prompt_length, max_new_tokens, vocab_size=vocab_size,
                                scored_rows=scored_rows, suffix_length=suffix_length)
    device = _device_of(model)
    check_fits(Estimate([(label, size, device) for label, size in parts],
                        alternatives=(("decoding", "rescoring"),)), what, advice)


def check_tables_fit(num_states: int, hidden_size: int | None, max_new_tokens: int,
                     device: str | torch.device = "cpu") -> None:
    """:func:`check_fits` for the guide tables of one DFA (:func:`guide_table_bytes`); with
    ``hidden_size=None`` (logical masking, no HMM) for its feasibility table alone, bool
    [n+1, S] (:func:`feasibility_bytes`)."""
    if hidden_size is None:
        size, what = feasibility_bytes(num_states, max_new_tokens), "feasibility table"
        advice = "use a smaller constraint (fewer DFA states) or a smaller max_new_tokens"
    else:
        size, what = guide_table_bytes(num_states, hidden_size, max_new_tokens), "guide tables"
        advice = ("use a smaller constraint (fewer DFA states), a smaller max_new_tokens or an "
                  "HMM with fewer hidden states")
    check_fits(Estimate([(what, size, str(device))]),
               f"the {what} of a {num_states}-state DFA"
               + ("" if hidden_size is None else f" with an h = {hidden_size} HMM")
               + f" and max_new_tokens={max_new_tokens}", advice)
