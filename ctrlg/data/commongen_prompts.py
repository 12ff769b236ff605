"""The text formats in which an LM meets CommonGen: one definition for training and decoding.

Three prompt styles (``PROMPT_STYLES``):

* ``instruct`` — an instruction in the model's chat template, "Write a sentence using the words:
  dog, frisbee, catch." (the zero-shot pipeline; the prompts the instruct HMM was distilled on,
  :func:`commongen_prompts`);
* ``bos`` — the BOS token alone (GeLaTo / Ctrl-G's *unsupervised* setting): the LM is adapted on
  target sentences only, text = BOS + " " + sentence + EOS, and at decoding the constraint alone
  carries the concepts;
* ``keywords`` — the *supervised* setting: BOS + "Concepts: dog, frisbee, catch.\\nSentence:"
  then " " + sentence + EOS.

``bos_token`` is the token string that starts a text. For SmolLM2 it is ``<|endoftext|>``, the
document separator of its pre-training corpus: dev references are more likely after it than
after the chat BOS ``<|im_start|>`` (4.92 against 5.13 nats/token, 400 references, the instruct
model). ``None`` means the tokenizer's own ``bos_token``.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ctrlg.errors import CtrlgError

__all__ = ["PROMPT_STYLES", "DEFAULT_BOS_TOKEN", "commongen_prompts", "bos_text", "prompt_text",
           "target_prefix", "target_text"]

PROMPT_STYLES = ("instruct", "bos", "keywords")
DEFAULT_BOS_TOKEN = "<|endoftext|>"


def commongen_prompts(concept_lines: Iterable[str], tokenizer=None) -> list[str]:
    """CommonGen-style instructions, one per concept line ("dog frisbee catch" →
    "Write a sentence using the words: dog, frisbee, catch."), deduplicated in order. With a
    ``tokenizer`` that has a chat template, each instruction is wrapped as a user turn with the
    assistant turn opened (``add_generation_prompt=True``)."""
    seen: dict[str, None] = {}
    for line in concept_lines:
        words = line.split()
        if words:
            seen.setdefault(" ".join(words), None)
    prompts = [f"Write a sentence using the words: {', '.join(c.split())}." for c in seen]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                 add_generation_prompt=True) for p in prompts]
    return prompts


def check_style(style: str) -> str:
    if style not in PROMPT_STYLES:
        raise CtrlgError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")
    return style


def bos_text(tokenizer, bos_token: str | None = DEFAULT_BOS_TOKEN) -> str:
    """The token string that starts a text (``bos_token``, or the tokenizer's BOS when None),
    checked to be a single token of ``tokenizer``."""
    token = bos_token if bos_token is not None else tokenizer.bos_token
    if token is None:
        raise CtrlgError("the tokenizer has no BOS token; pass bos_token= (e.g. '<|endoftext|>')")
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise CtrlgError(f"bos_token {token!r} is not one token of this tokenizer "
                         f"(it encodes to {ids}); name one of its special tokens")
    return token


def prompt_text(concepts: Sequence[str], style: str, tokenizer,
                bos_token: str | None = DEFAULT_BOS_TOKEN) -> str:
    """The prompt (text, special tokens spelled out) for a concept set in ``style``."""
    check_style(style)
    if style == "instruct":
        (prompt,) = commongen_prompts([" ".join(concepts)], tokenizer)
        return prompt
    start = bos_text(tokenizer, bos_token)
    if style == "bos":
        return start
    return f"{start}Concepts: {', '.join(concepts)}.\nSentence:"


def target_prefix(style: str) -> str:
    """What separates the prompt from the sentence: " " after the ``bos`` and ``keywords``
    prompts (the adapters were trained on prompt + " " + sentence + EOS, :func:`target_text`);
    nothing after the ``instruct`` prompt, whose chat template ends with a newline."""
    return "" if check_style(style) == "instruct" else " "


def target_text(sentence: str, tokenizer) -> str:
    """What follows the prompt in training: " " + the sentence + the tokenizer's EOS token."""
    if tokenizer.eos_token is None:
        raise CtrlgError("the tokenizer has no EOS token to end a training target")
    return target_prefix("bos") + " ".join(sentence.split()) + tokenizer.eos_token
