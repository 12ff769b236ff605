"""LAMBADA reader (Paperno et al., ACL 2016): predict the last word of a passage.

The bundled file is the detokenised test split OpenAI used for GPT-2 (5,153 passages, CC BY 4.0,
see ``bundled/README.md``). As in that evaluation (and ReLM's), the *target* is the text after the
last whitespace of the passage and the *context* is everything before that whitespace.
The passages are also the offline story corpus of the infilling experiment
(:func:`load_lambada_passages`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ctrlg.data._files import DatasetError, bundled_path, read_jsonl

__all__ = ["LambadaExample", "load_lambada", "load_lambada_passages"]


@dataclass(frozen=True)
class LambadaExample:
    """``context + " " + target`` is the passage; ``target`` is its last word."""

    context: str
    target: str


def _passages(path, limit):
    source = bundled_path("lambada_test.jsonl") if path is None else path
    texts = []
    for row in read_jsonl(source, limit=limit):
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            raise DatasetError(f"{source}: a row lacks a non-empty 'text' field: {row!r:.200}")
        texts.append(text.strip())
    return texts


def load_lambada(path=None, limit: int | None = None) -> list[LambadaExample]:
    """The first ``limit`` LAMBADA passages split into (context, last word)."""
    examples = []
    for text in _passages(path, limit):
        head, _, target = text.rpartition(" ")
        if not head:
            raise DatasetError(f"LAMBADA passage has a single word, no context: {text!r:.80}")
        examples.append(LambadaExample(head.rstrip(), target))
    return examples


def load_lambada_passages(path=None, limit: int | None = None) -> list[str]:
    """The first ``limit`` LAMBADA passages as whole texts (a narrative corpus available offline)."""
    return _passages(path, limit)
