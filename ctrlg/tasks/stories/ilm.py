"""ILM's text format (Donahue et al., ACL 2020, "Enabling Language Models to Fill in the Blanks", §3).

A masked passage x̃ (each masked span replaced by a blank token of its granularity) is followed by
a separator and the spans' texts y_1 … y_k, each ended by an answer token:

    BOS x̃ [sep] y_1 [answer] y_2 [answer] … y_k [answer]

An LM fine-tuned on such sequences (loss on the answers) infills by reading x̃ and sampling the
answers left to right; the completed passage puts y_i in the i-th blank. The markers are single
tokens of the vocabulary, so the embedding matrix need not grow and a LoRA adapter alone learns the
format. The markers the LM only reads (blanks, [sep]) are SmolLM2's unused special tokens (its
code-corpus markers). The one it must *write*, [answer], is a token the LM was trained to emit
(``<|im_end|>``, its end of turn): LoRA leaves the (tied) embeddings frozen, so an unused token's
output embedding keeps its untrained value and its logit stays far below the others (with
``<empty_output>`` as [answer], log p ≈ −10 where an answer ends, and sampling never wrote it).
:class:`IlmTokens` names them; :meth:`IlmTokens.check` refuses a tokenizer where one is not a
single token.

The answers keep the span's exact characters (no surrounding whitespace: x̃ keeps the whitespace
around each blank), so the completed passage equals the original when every answer is right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ctrlg.data.infill_mask import Granularity, MaskedDocument
from ctrlg.errors import CtrlgError

__all__ = ["IlmTokens", "masked_text", "answers_text", "ilm_example", "split_answers",
           "complete"]


@dataclass(frozen=True)
class IlmTokens:
    """The marker tokens (strings) of the format; each must be one token of the tokenizer."""

    blanks: dict = field(default_factory=lambda: {
        Granularity.DOCUMENT.value: "<jupyter_start>",
        Granularity.PARAGRAPH.value: "<jupyter_text>",
        Granularity.SENTENCE.value: "<jupyter_code>",
        Granularity.NGRAM.value: "<jupyter_output>",
        Granularity.WORD.value: "<jupyter_script>",
    })
    sep: str = "<file_sep>"
    answer: str = "<|im_end|>"

    def check(self, tokenizer) -> dict[str, int]:
        """{marker: id}; CtrlgError naming a marker that is not a single token."""
        ids = {}
        for marker in [*self.blanks.values(), self.sep, self.answer]:
            encoded = tokenizer(marker, add_special_tokens=False)["input_ids"]
            if len(encoded) != 1:
                raise CtrlgError(f"ILM marker {marker!r} is not one token of this tokenizer "
                                 f"(encodes to {encoded}); name unused single tokens in IlmTokens")
            ids[marker] = encoded[0]
        if len(set(ids.values())) != len(ids):
            raise CtrlgError("ILM markers must be distinct tokens")
        return ids


def masked_text(document: MaskedDocument, tokens: IlmTokens) -> str:
    """x̃: the passage with each span replaced by its granularity's blank token."""
    pieces = document.fragments
    out = [pieces[0]]
    for span, fragment in zip(document.spans, pieces[1:]):
        out += [tokens.blanks[span.granularity.value], fragment]
    return "".join(out)


def answers_text(answers: Sequence[str], tokens: IlmTokens) -> str:
    return "".join(a + tokens.answer for a in answers)


def ilm_example(document: MaskedDocument, tokens: IlmTokens, bos: str) -> tuple[str, str]:
    """(prompt, target) of one training example: BOS x̃ [sep] | y_1 [answer] … y_k [answer]."""
    return f"{bos}{masked_text(document, tokens)}{tokens.sep}", answers_text(document.answers, tokens)


def split_answers(ids: Sequence[int], answer_id: int, count: int) -> list[list[int]] | None:
    """The first ``count`` answers of generated ids (each ended by ``answer_id``), or None when
    fewer were completed."""
    answers, current = [], []
    for token in ids:
        if int(token) == answer_id:
            answers.append(current)
            current = []
            if len(answers) == count:
                return answers
        else:
            current.append(int(token))
    return None


def complete(document: MaskedDocument, answers: Sequence[str]) -> str:
    """The passage with the i-th span replaced by ``answers[i]`` (missing answers: empty)."""
    pieces = document.fragments
    out = [pieces[0]]
    for i, fragment in enumerate(pieces[1:]):
        out += [answers[i] if i < len(answers) else "", fragment]
    return "".join(out)
