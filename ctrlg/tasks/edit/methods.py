"""The editing methods of the benchmark, all on the editing LM (the continuation adapter) and its
prompt (:func:`ctrlg.data.story_prompts.continuation_prompt`):

* ``ctrlg`` — the example's constraint (:func:`constraint_for`: the editor's own constraint,
  :mod:`ctrlg.dfa.edit_constraint`, with EOS required so the text ends where the LM ends it), guided
  by the task HMM; for insertion the suffix is part of the constraint (Ctrl-G §5: the HMM must
  emit the suffix's first tokens right after the generation); ``num_samples`` samples, the one
  with the highest log p_lm(y ⊕ σ | prompt) kept (:func:`ctrlg.generate`);
* ``logical`` — the same constraint with logical masking (no HMM, no model of the suffix), the
  same sampling and ranking;
* ``prompt_only`` — no constraint: the constraints are stated in the instruction instead
  (:func:`instruction`, as the paper's TULU2 / GPT baselines had them), ``num_samples`` plain
  samples, the most likely kept by the same ranking.

Every method gets the same token budget (``max_new_tokens``) and the same sampling settings
(``temperature``, ``top_p``); a sample without a word is no candidate. ``strength`` w is ctrlg's
guidance strength (p_lm · p_hmm(α | ·)^w; 1 is Ctrl-G, the constraint holds at any w).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ctrlg.dfa.edit_constraint import EditConstraint, build_constraint
from ctrlg.data.story_prompts import CONTINUE_INSTRUCTION, bos_text
from ctrlg.dfa import intersect
from ctrlg.dfa.builders import eos as eos_dfa
from ctrlg.dfa.words import count_words
from ctrlg.lm.shared_context import shared_prompt_inputs
from ctrlg.sampler import candidate_log_likelihoods
from ctrlg.sampler import generate as guided_generate
from ctrlg.tasks.edit.examples import EditExample

__all__ = ["METHODS", "Output", "instruction", "constraint_for", "run_method"]

METHODS = ("prompt_only", "logical", "ctrlg")


@dataclass
class Output:
    text: str
    accepted: bool
    seconds: float
    candidates: int


def _quoted(words) -> str:
    words = [f'"{w}"' for w in words]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def instruction(example: EditExample) -> str:
    """The continuation instruction with the example's constraints (and suffix) written into it."""
    parts = []
    if example.min_words is not None:
        parts.append(f"in {example.min_words} to {example.max_words} words")
    if example.keyphrases:
        parts.append(f"using the word{'s' if len(example.keyphrases) > 1 else ''} "
                     f"{_quoted(example.keyphrases)}")
    text = CONTINUE_INSTRUCTION.rstrip(":")
    if parts:
        text += " " + ", ".join(parts)
    if example.suffix.strip():
        text += f', so that the text then goes on with "{" ".join(example.suffix.split()[:30])}"'
    return text + ":"


def prompt_for(example: EditExample, tokenizer, bos_token: str, constraints_in_prompt: bool) -> str:
    head = instruction(example) if constraints_in_prompt else CONTINUE_INSTRUCTION
    return f"{bos_text(tokenizer, bos_token)}{head}\n\n{example.prefix}"


def constraint_for(example: EditExample, tokenizer, vocab_size: int, eos_id: int):
    """The editor's constraint for the example (keyphrases, word range — at least one word, as
    every kind asks for some text —, no line break, valid UTF-8) with EOS required at the end."""
    low = 1 if example.min_words is None else example.min_words
    spec = EditConstraint.from_lists(list(example.keyphrases), [], low, example.max_words,
                                     allow_newlines=False)
    return intersect(build_constraint(tokenizer, spec, vocab_size, [eos_id]),
                     eos_dfa(eos_id, vocab_size, required=True))


def _suffix_ids(example: EditExample, tokenizer, suffix_tokens: int) -> list[int] | None:
    if not example.suffix.strip():
        return None
    return tokenizer(example.suffix, add_special_tokens=False)["input_ids"][:suffix_tokens]


def _rank(model, prompt_ids: list[int], candidates: list[list[int]], suffix: list[int] | None,
          eos_id: int) -> int:
    """Index of the candidate with the highest log p_lm(y ⊕ σ | prompt) (insertion: the body
    without its EOS, then the suffix) or log p_lm(y | prompt) (continuation: EOS included when it
    ended y)."""
    scored = [(c[:-1] if c and c[-1] == eos_id else c) + suffix if suffix else c for c in candidates]
    scores = candidate_log_likelihoods(model, prompt_ids, scored)
    return max(range(len(candidates)), key=lambda i: scores[i])


def run_method(method: str, example: EditExample, model, tokenizer, *, hmm, eos_id: int,
               num_samples: int, max_new_tokens: int, seed: int, bos_token: str = "<|endoftext|>",
               suffix_tokens: int = 32, constraint=None, precision: str = "float32",
               temperature: float = 1.0, top_p: float = 1.0, strength: float = 1.0) -> Output:
    """One method on one example (module docstring)."""
    start = time.perf_counter()
    suffix = _suffix_ids(example, tokenizer, suffix_tokens)
    prompt = prompt_for(example, tokenizer, bos_token, constraints_in_prompt=method == "prompt_only")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if method == "prompt_only":
        inputs = shared_prompt_inputs(model, prompt_ids, num_samples) or {
            "input_ids": torch.tensor([prompt_ids]), "num_return_sequences": num_samples,
            "attention_mask": torch.ones(1, len(prompt_ids), dtype=torch.long)}
        torch.manual_seed(seed)
        out = model.generate(**inputs, do_sample=True, top_k=0, top_p=top_p,
                             temperature=temperature, max_new_tokens=max_new_tokens,
                             eos_token_id=eos_id, pad_token_id=eos_id)
        candidates = [row[:row.index(eos_id) + 1] if eos_id in row else row
                      for row in out[:, len(prompt_ids):].tolist()]
        # a suggestion holds a word: empty samples (EOS at once) are no candidates, as in the editor
        candidates = [c for c in candidates if count_words(tokenizer.decode(
            c[:-1] if c and c[-1] == eos_id else c))] or candidates[:1]
        accepted = [True] * len(candidates)
    elif method in ("logical", "ctrlg"):
        if constraint is None:
            constraint = constraint_for(example, tokenizer, len(tokenizer), eos_id)
        generations = guided_generate(model, tokenizer, prompt_ids, constraint,
                                      hmm=hmm if method == "ctrlg" else None, mode=method,
                                      suffix=suffix if method == "ctrlg" else None,
                                      max_new_tokens=max_new_tokens, num_samples=num_samples,
                                      seed=seed, do_sample=True, top_k=0, top_p=top_p,
                                      temperature=temperature, rank_by_lm=False,
                                      eos_token_id=eos_id, precision=precision,
                                      strength=strength if method == "ctrlg" else 1.0)
        candidates = [g.token_ids for g in generations]
        accepted = [bool(constraint.accepts(c)) for c in candidates]
    else:
        raise ValueError(f"unknown editing method {method!r}")
    if not candidates:
        return Output("", False, time.perf_counter() - start, 0)
    best = _rank(model, prompt_ids, candidates, suffix, eos_id)
    ids = candidates[best]
    body = ids[:-1] if ids and ids[-1] == eos_id else ids
    return Output(tokenizer.decode(body), accepted[best], time.perf_counter() - start,
                  len(candidates))
