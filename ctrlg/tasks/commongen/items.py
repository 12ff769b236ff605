"""One CommonGen item's pieces: its keyword groups and constraint DFA, whether the token budget can
meet it, its prompt (and the judge's), and the items and batches of a run.

The constraint: every concept occurs as a whole word in one of its inflected forms
(:func:`ctrlg.dfa.commongen_constraint`, lemminflect), between ``constraint.min_words`` and
``constraint.max_words`` words, then EOS. The prompt: ``model.prompt_style`` of
:mod:`ctrlg.data.commongen_prompts` (instruct, bos or keywords).

May import: the library below :mod:`ctrlg.tasks` and :mod:`ctrlg.tasks.records` / :mod:`ctrlg.tasks.config`; within
this package, nothing (the other modules build on this one).
"""

from __future__ import annotations

from types import SimpleNamespace

from omegaconf import DictConfig

from ctrlg import dfa
from ctrlg.data import load_commongen
from ctrlg.data.commongen_prompts import (DEFAULT_BOS_TOKEN, check_style, commongen_prompts,
                                          prompt_text)
from ctrlg.errors import ExperimentConfigError, UnsatisfiableConstraintError
from ctrlg.guide.feasibility import Feasibility
from ctrlg.lm.adapters import adapter_info

__all__ = ["keyword_groups", "build_constraint", "unsatisfiable_reason", "prompt_ids", "judge_style", "judge_prompt_ids", "word_count", "select_items", "batches"]


def keyword_groups(example, constraint_cfg) -> list[list[str]]:
    """One group of accepted surface forms per concept: the lemma and, with
    ``constraint.inflections``, its inflections (:func:`ctrlg.dfa.inflections`, lemminflect)."""

    if not constraint_cfg.inflections:
        return [[lemma] for lemma in example.concepts]
    return [list(dfa.inflections(lemma, pos)) for lemma, pos in zip(example.concepts, example.pos)]


def build_constraint(example, groups, tokenizer, constraint_cfg, vocab_size: int, eos: int):
    """keywords(groups) ∧ min_words ≤ words ≤ max_words ∧ EOS ends the generation."""

    if constraint_cfg.inflections:
        concepts = [f"{c}_{p[0]}" if p else c for c, p in zip(example.concepts, example.pos)]
        return dfa.commongen_constraint(concepts, tokenizer, min_words=constraint_cfg.min_words,
                                        max_words=constraint_cfg.max_words, eos_token_id=eos,
                                        vocab_size=vocab_size)
    return dfa.intersect(dfa.keywords(groups, tokenizer, vocab_size=vocab_size),
                         dfa.word_count(constraint_cfg.min_words, constraint_cfg.max_words,
                                        tokenizer, vocab_size=vocab_size),
                         dfa.eos(eos, vocab_size, required=True))


def unsatisfiable_reason(constraint, cfg, eos: list[int]) -> str | None:
    """Why no generation of ≤ ``generation.max_new_tokens`` tokens can satisfy ``constraint``
    (None when one can): the DFA-only check of :class:`ctrlg.guide.feasibility.Feasibility`."""
    try:
        Feasibility(constraint, int(cfg.generation.max_new_tokens),
                    min_new_tokens=int(cfg.constraint.min_new_tokens),
                    eos_token_id=list(eos) if eos else None).check_satisfiable()
    except UnsatisfiableConstraintError as error:
        return str(error)
    return None


def prompt_ids(example, tokenizer, model_cfg) -> list[int]:
    """The prompt of one item in ``model.prompt_style`` (:mod:`ctrlg.data.commongen_prompts`):
    ``instruct`` — the instruction of :func:`ctrlg.data.commongen_prompts.commongen_prompts` (the prompts
    the instruct HMM was distilled on), in the chat template when ``model.chat_template``;
    ``bos`` — the BOS token alone (the adapted LM of the paper's unsupervised setting; the
    constraint carries every concept); ``keywords`` — BOS + the concepts (supervised setting)."""

    style = model_cfg.get("prompt_style") or "instruct"
    if style == "instruct":
        chat = bool(model_cfg.get("chat_template", True))
        (prompt,) = commongen_prompts([" ".join(example.concepts)], tokenizer if chat else None)
        return tokenizer(prompt, add_special_tokens=not chat)["input_ids"]
    text = prompt_text(example.concepts, style, tokenizer,
                       model_cfg.get("bos_token", DEFAULT_BOS_TOKEN))
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def judge_style(judge_cfg) -> dict:
    """The judge's text format: ``judge.prompt_style`` / ``judge.bos_token`` when set, else the
    format ``judge.adapter`` was trained on (its ``ctrlg_adapter.json``: the supervised CommonGen
    adapter reads ``keywords``), else ``instruct`` (the embedded LM's chat instruction). The
    adapter's file is read only when a setting is left open, so a resolved style costs no I/O."""
    settled = judge_cfg.get("prompt_style") and judge_cfg.get("bos_token")
    trained = adapter_info(judge_cfg["adapter"]) if judge_cfg.get("adapter") and not settled else {}
    style = judge_cfg.get("prompt_style") or trained.get("prompt_style") or "instruct"
    check_style(style)
    return {"prompt_style": style, "chat_template": bool(judge_cfg.get("chat_template", True)),
            "bos_token": judge_cfg.get("bos_token") or trained.get("bos_token") or DEFAULT_BOS_TOKEN}


def judge_prompt_ids(concepts: list[str], tokenizer, judge_cfg) -> list[int]:
    """The judge's prompt for one item: :func:`prompt_ids` in :func:`judge_style` (default
    ``instruct``: the instruction naming the concepts, in the chat template)."""
    return prompt_ids(SimpleNamespace(concepts=list(concepts)), tokenizer, judge_style(judge_cfg))


def word_count(text: str) -> int:
    return len(text.split())


def select_items(cfg: DictConfig):
    """``data.limit`` items of the dataset from ``data.offset`` on, with their dataset indices."""

    offset, limit = int(cfg.data.get("offset", 0)), cfg.data.limit
    examples = load_commongen(cfg.data.path, limit=None if limit is None else offset + limit)
    if offset >= len(examples):
        raise ExperimentConfigError(f"data.offset={offset} but the dataset has only "
                                    f"{len(examples)} items")
    return list(enumerate(examples))[offset:]


def batches(items: list, size: int) -> list[list]:
    """Items grouped by ``dataset index // size``: the same batches (hence the same samples)
    whether items [0, 200) run at once or as [0, 100) and [100, 200) (when size divides 100)."""
    groups: dict[int, list] = {}
    for index, example in items:
        groups.setdefault(index // size, []).append((index, example))
    return list(groups.values())
