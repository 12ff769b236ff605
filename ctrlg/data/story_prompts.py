"""The text formats in which the story LMs meet their data: one definition for training and decoding.

Three forms (``FORMS``), each an LM adapted with LoRA on the training split of
:mod:`ctrlg.data.stories` (:mod:`ctrlg.tasks.stories.adaptation`); the HMMs are distilled from
their samples under the same prompts (:func:`continuation_prompts` for the editing HMM):

* ``plain`` — Ctrl-G's infilling LM (§4.2): plain language modelling of whole passages,
  text = BOS + passage + EOS, the loss on every passage token. At decoding the prompt is BOS
  alone and the constraint carries the unmasked fragments.
* ``continuation`` — Ctrl-G's editing LM (§5): prompt = BOS + ``"Continue the given text:"`` +
  a blank line + a story prefix; target = the span that follows it (a few whole sentences,
  :func:`continuation_spans`) + EOS, the loss on the target only. At decoding the prompt is
  the same with the writer's text before the cursor; an insertion's suffix is part of the
  constraint (:mod:`ctrlg.sampler`, ``suffix_ids``).
* ``ilm`` — the supervised baseline, ILM's format (Donahue et al. 2020, §3): the passage with each
  masked span replaced by a blank token of its granularity, a separator, then each span's text
  ended by an answer token (``ctrlg.tasks.stories.ilm``); the loss on the answers only.

BOS is ``<|endoftext|>`` for SmolLM2 (its pre-training document separator, as for CommonGen,
:mod:`ctrlg.data.commongen_prompts`); EOS is the tokenizer's EOS token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ctrlg.data.infill_mask import parse_hierarchy
from ctrlg.data.stories import load_stories
from ctrlg.errors import CtrlgError

__all__ = ["FORMS", "DEFAULT_BOS_TOKEN", "CONTINUE_INSTRUCTION", "Span", "bos_text",
           "eos_text", "plain_example", "continuation_prompt", "continuation_spans",
           "choose_span", "continuation_prompts"]

FORMS = ("plain", "continuation", "ilm")
DEFAULT_BOS_TOKEN = "<|endoftext|>"
CONTINUE_INSTRUCTION = "Continue the given text:"

_SENTENCE_END = (".", "!", "?", '"', "'", "”", "’", ")", "]")


def bos_text(tokenizer, bos_token: str | None = DEFAULT_BOS_TOKEN) -> str:
    """The token string that starts a text, checked to be one token of ``tokenizer``."""
    token = bos_token if bos_token is not None else tokenizer.bos_token
    if token is None:
        raise CtrlgError("the tokenizer has no BOS token; pass bos_token= (e.g. '<|endoftext|>')")
    if len(tokenizer(token, add_special_tokens=False)["input_ids"]) != 1:
        raise CtrlgError(f"bos_token {token!r} is not one token of this tokenizer")
    return token


def eos_text(tokenizer) -> str:
    if tokenizer.eos_token is None:
        raise CtrlgError("the tokenizer has no EOS token to end a training target")
    return tokenizer.eos_token


def plain_example(passage: str, tokenizer, bos_token: str | None = DEFAULT_BOS_TOKEN
                  ) -> tuple[str, str]:
    """(prompt, target) of the ``plain`` form: BOS, then the passage + EOS."""
    return bos_text(tokenizer, bos_token), passage + eos_text(tokenizer)


def continuation_prompt(prefix: str, tokenizer, bos_token: str | None = DEFAULT_BOS_TOKEN) -> str:
    """The ``continuation`` form's prompt for a story ``prefix`` (trailing whitespace removed:
    BPE vocabularies attach the space to the next word, so the span starts with it)."""
    return f"{bos_text(tokenizer, bos_token)}{CONTINUE_INSTRUCTION}\n\n{prefix.rstrip()}"


@dataclass(frozen=True)
class Span:
    """Characters ``text[start:end]`` of a passage: whole sentences, ``words`` of them."""

    start: int
    end: int
    words: int


def continuation_spans(text: str, min_words: int = 5, max_words: int = 40,
                       max_sentences: int = 2) -> list[Span]:
    """Every span of 1 … ``max_sentences`` consecutive whole sentences of one paragraph that has a
    non-empty prefix, ends with sentence-final punctuation (so the passage's unfinished last
    sentence is never one) and holds ``min_words`` … ``max_words`` words — the spans an editor is
    asked to continue or insert, and the continuation LM's targets."""
    spans = []
    for _, sentences in parse_hierarchy(text):
        for first in range(len(sentences)):
            for last in range(first, min(first + max_sentences, len(sentences))):
                start, end = sentences[first][0][0], sentences[last][0][1]
                words = sum(len(sentences[k][1]) for k in range(first, last + 1))
                if start == 0 or not text[start:end].endswith(_SENTENCE_END):
                    continue
                if not text[start:end].rstrip("\"'”’)]").endswith((".", "!", "?")):
                    continue
                if min_words <= words <= max_words:
                    spans.append(Span(start, end, words))
    return spans


def choose_span(text: str, rng: np.random.Generator, **limits) -> Span | None:
    """One of :func:`continuation_spans` drawn uniformly, or None when the passage has none."""
    spans = continuation_spans(text, **limits)
    return spans[int(rng.integers(len(spans)))] if spans else None


def continuation_prompts(tokenizer, per_passage: int = 1, seed: int = 0, path=None,
                         bos_token: str | None = DEFAULT_BOS_TOKEN) -> list[str]:
    """The ``continuation`` form's prompts at ``per_passage`` span starts drawn per training
    passage (:func:`choose_span`, generator seeded with ``seed``): what the editing HMM's samples
    continue. Deduplicated in order."""
    rng = np.random.default_rng(seed)
    prompts = []
    for story in load_stories("train", path):
        for _ in range(per_passage):
            span = choose_span(story.text, rng)
            if span is not None:
                prompts.append(continuation_prompt(story.text[:span.start], tokenizer, bos_token))
    return list(dict.fromkeys(prompts))
