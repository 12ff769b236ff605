"""Infilling with the ILM-style supervised baseline: sample the answers after x̃ [sep].

ILM (Donahue et al. 2020) decodes by sampling: the fine-tuned LM reads the masked passage and its
separator (:func:`ctrlg.tasks.stories.ilm.ilm_example`) and writes y_1 [answer] y_2 [answer] …;
the i-th answer fills the i-th blank (:func:`ctrlg.tasks.stories.ilm.complete`). Sampling is
nucleus sampling (``top_p``; ILM's own inference code, ``infill_with_ilm``, samples with nucleus
0.95 at temperature 1, no top-k), with the format's markers other than [answer] and every EOS
suppressed, and stops for a row once it has written k answers. An answer is never empty (a
masked span always holds text, so training never showed [answer] right after [sep] or another
[answer]): there [answer] is suppressed too. A row that spends its budget first is completed
with the answers it has (the rest empty) and counted as failed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from ctrlg.data.infill_mask import MaskedDocument
from ctrlg.errors import ConstraintError
from ctrlg.tasks.infill.constraint import completion_ok
from ctrlg.data.story_prompts import bos_text
from ctrlg.tasks.stories.ilm import IlmTokens, complete, ilm_example, split_answers

__all__ = ["IlmFill", "ilm_fill"]


@dataclass
class IlmFill:
    """One ILM completion: the passage, its answers and whether all k were written and each fits
    its blank's granularity (:func:`ctrlg.tasks.infill.constraint.completion_ok`)."""

    text: str
    answers: list[str]
    complete: bool
    accepted: bool
    tokens: int


class _AnswersWritten(StoppingCriteria):
    def __init__(self, answer_id: int, count: int, prompt_length: int):
        self.answer_id, self.count, self.prompt_length = answer_id, count, prompt_length

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        written = (input_ids[:, self.prompt_length:] == self.answer_id).sum(1)
        return written >= self.count


class _NoEmptyAnswer(LogitsProcessor):
    """[answer] is not allowed as an answer's first token (right after the prompt, which ends with
    [sep], or after another [answer])."""

    def __init__(self, answer_id: int, prompt_length: int):
        self.answer_id, self.prompt_length = answer_id, prompt_length

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] == self.prompt_length:
            starts = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        else:
            starts = input_ids[:, -1] == self.answer_id
        scores[starts, self.answer_id] = float("-inf")
        return scores


@torch.no_grad()
def ilm_fill(model, tokenizer, document: MaskedDocument, *, max_new_tokens: int, seed: int,
             num_samples: int = 1, temperature: float = 1.0, top_p: float = 1.0,
             tokens: IlmTokens | None = None,
             bos_token: str | None = "<|endoftext|>", eos_ids=()) -> list[IlmFill]:
    """``num_samples`` ILM completions of ``document`` (module docstring); ``top_p`` in (0, 1] is
    the nucleus (1: plain sampling)."""
    if not 0 < float(top_p) <= 1:
        raise ConstraintError(f"top_p must lie in (0, 1], got {top_p!r}")
    tokens = tokens or IlmTokens()
    ids = tokens.check(tokenizer)
    answer_id = ids[tokens.answer]
    prompt, _ = ilm_example(document, tokens, bos_text(tokenizer, bos_token))
    prompt_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    k = len(document.spans)
    suppressed = sorted(({i for m, i in ids.items() if m != tokens.answer} | {int(e) for e in eos_ids}
                         | {i for i in (tokenizer.bos_token_id, tokenizer.eos_token_id) if i is not None})
                        - {answer_id})             # the answer marker may be an EOS token
    torch.manual_seed(int(seed))
    device = next(model.parameters()).device
    out = model.generate(prompt_ids.to(device), attention_mask=torch.ones_like(prompt_ids).to(device),
                         do_sample=True, temperature=float(temperature), top_k=0, top_p=float(top_p),
                         max_new_tokens=int(max_new_tokens), num_return_sequences=int(num_samples),
                         suppress_tokens=suppressed, pad_token_id=answer_id,
                         # the rows end by the stopping criterion only: generate's own EOS (which
                         # may be [answer] itself, e.g. SmolLM2's <|im_end|>) is set to [sep],
                         # which is suppressed
                         eos_token_id=ids[tokens.sep],
                         logits_processor=LogitsProcessorList([_NoEmptyAnswer(answer_id, prompt_ids.shape[1])]),
                         stopping_criteria=StoppingCriteriaList(
                             [_AnswersWritten(answer_id, k, prompt_ids.shape[1])]))
    fills = []
    for row in out[:, prompt_ids.shape[1]:].tolist():
        answers_ids = split_answers(row, answer_id, k)
        written = answers_ids is not None
        if answers_ids is None:                      # the budget ran out: keep what was answered
            partial, current = [], []
            for t in row:
                if t == answer_id:
                    partial.append(current)
                    current = []
                else:
                    current.append(t)
            answers_ids = partial
        answers = [tokenizer.decode(a) for a in answers_ids]
        text = complete(document, answers)
        used = len(row) if not written else sum(len(a) + 1 for a in answers_ids)
        fills.append(IlmFill(text, answers, written, written and completion_ok(document, text), used))
    return fills
