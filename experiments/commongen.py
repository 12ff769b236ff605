"""CommonGen with the embedded LM (Ctrl-G §4.1): generate a sentence using every concept.

    python -m experiments.commongen [data.limit=N] [data.offset=M] [methods=[logical,ctrlg]]
                                    [generation.num_samples=K] [generation.num_beams=B] [resume=true]

For each concept set: the instruction "Write a sentence using the words: field, look, stand." in
the LM's chat template (the prompt the embedded HMM was distilled on, built by
:func:`ctrlg.hmm.sampling.commongen_prompts`); a constraint DFA "every concept occurs as a whole
word in one of its inflected forms, then EOS" (:func:`ctrlg.dfa.commongen_constraint` over keyword
groups from :func:`ctrlg.dfa.inflections`, lemminflect), at least ``constraint.min_words`` words;
K samples per method (or K of B beams), reranked by the LM log-likelihood log p_lm(y | prompt)
with constraint-satisfying samples first.

Batching: ``batch_size`` items are decoded together, left-padded, one DFA per input row
(:class:`ctrlg.ConstraintLogitsProcessor` takes a list of DFAs); each item expands into its K
consecutive samples/beams. Each batch draws from its own seed (run seed, first item, method), so
a resumed run reproduces an uninterrupted one.

Methods are named entries of ``method_specs`` (``guide``: none | logical | ctrlg; ``prior``:
filter, the HMM's own forward posterior over the generated tokens, or head, the LM-conditioned
prior saved with the HMM (:class:`ctrlg.guide.priors.HeadPrior`); ``strength`` w: the guided
distribution ∝ p_lm(v) · p_hmm(α | x≤t, v)^w, w = 0 is logical masking, w = 1 Ctrl-G). The method
named ``ctrlg`` is the recommended configuration; ablations have their own names.

Robustness: every finished batch of items is appended to ``generations.jsonl`` at once;
``resume=true`` (the newest earlier run of the same configuration) or ``resume=<run dir>``
continues an interrupted run; an item whose constraint cannot be met within the token budget is
reported by index and concept set, recorded as skipped, and the others go on.

Prints BLEU-4 / ROUGE-L / CIDEr / METEOR (when Java is present) / constraint success % / mean
words per method (and the references' mean words), the paired-bootstrap 95 % intervals of each
guided method − ``bootstrap.baseline`` per metric, and writes ``generations.jsonl``,
``metrics.json`` and ``config.yaml`` into Hydra's run directory.
"""

from __future__ import annotations

import math
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from ctrlg import dfa, metrics
from ctrlg.beam_likelihood import BeamLogLikelihoods, records_lm_log_probs
from ctrlg.data import load_commongen
from ctrlg.adapters import adapter_info
from ctrlg.data.commongen_prompts import (DEFAULT_BOS_TOKEN, check_style, prompt_text,
                                         target_prefix)
from ctrlg.errors import UnsatisfiableConstraintError
from ctrlg.guide.feasibility import Feasibility
from ctrlg.hmm.sampling import commongen_prompts
from ctrlg.judge import Judge
from ctrlg.mbr import mbr_pick
from ctrlg.guide.priors import HeadPrior
from ctrlg.sampler import ConstraintLogitsProcessor, candidate_log_likelihoods, trim_at_eos
from ctrlg.search_options import SearchOptions
from ctrlg.validation import check_context_length
from ctrlg.vocab import eos_token_ids

from experiments.common import (METRIC_NAMES, ExperimentConfigError, RecordWriter,
                                find_resume_dir, format_table, generation_config,
                                hydra_output_dir, interval_cell, interval_header, load_hmm,
                                load_lm, paired_intervals, progress, read_records,
                                report_errors, resolve_device, start_run, write_json)

GUIDES = ("none", "logical", "ctrlg")
PRIORS = ("filter", "head")
TABLE_COLUMNS = ["method", "bleu4", "rouge_l", "cider", "meteor", "success", "keywords", "words",
                 "seconds"]
TABLE_HEADERS = ["method", "BLEU-4", "ROUGE-L", "CIDEr", "METEOR", "success %", "all words %",
                 "words", "time s"]
# the configuration keys that decide the generations: a resumed run must agree on all of them
GENERATION_KEYS = ("seed", "methods", "method_specs", "generation", "model", "hmm", "data",
                   "constraint", "rerank", "batch_size")
# sub-keys of those that say how the generations are computed, not what they are (left out of a
# run's identity: a GPU run resumes and merges with a CPU one)
COMPUTE_ONLY_KEYS = {"generation": ("guide_kernel", "fast_search")}
# sub-keys left out of a run's identity while at these values (runs from before they existed match)
DEFAULT_VALUED_KEYS = {"generation": {"beam_score": "guided", "sibling_penalty": 0.0}}


def without_compute_settings(key: str, value):
    """``value`` of the setting ``key`` without its :data:`COMPUTE_ONLY_KEYS` sub-keys and its
    :data:`DEFAULT_VALUED_KEYS` sub-keys at their defaults."""
    dropped = COMPUTE_ONLY_KEYS.get(key, ())
    defaults = DEFAULT_VALUED_KEYS.get(key, {})
    if (dropped or defaults) and isinstance(value, dict):
        return {k: v for k, v in value.items()
                if k not in dropped and not (k in defaults and v == defaults[k])}
    return value


# ---------------------------------------------------------------------- configuration
def method_spec(cfg: DictConfig, name: str) -> dict:
    """The spec of method ``name`` (``method_specs.<name>``), checked."""
    specs = cfg.get("method_specs") or {}
    if name not in specs:
        raise ExperimentConfigError(f"unknown method {name!r}; define it under method_specs or "
                                    f"choose from {sorted(specs)}")
    spec = {"guide": "ctrlg", "prior": "filter", "strength": 1.0,
            **OmegaConf.to_container(specs[name], resolve=True)}
    if spec["guide"] not in GUIDES:
        raise ExperimentConfigError(f"method_specs.{name}.guide must be one of {GUIDES}, got "
                                    f"{spec['guide']!r}")
    if spec["guide"] == "ctrlg":
        if spec["prior"] not in PRIORS:
            raise ExperimentConfigError(f"method_specs.{name}.prior must be one of {PRIORS}, "
                                        f"got {spec['prior']!r}")
        strength = spec["strength"]
        if not isinstance(strength, (int, float)) or not math.isfinite(strength) or strength < 0:
            raise ExperimentConfigError(f"method_specs.{name}.strength must be a finite number "
                                        f"≥ 0, got {strength!r}")
    return spec


def check_config(cfg: DictConfig) -> dict[str, dict]:
    """Validate the sizes and methods before anything is loaded; returns ``{method: spec}``."""
    gen = cfg.generation
    for key, value in (("generation.num_samples", gen.num_samples),
                       ("generation.num_beams", gen.get("num_beams", 1)),
                       ("generation.max_new_tokens", gen.max_new_tokens),
                       ("batch_size", cfg.batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExperimentConfigError(f"{key} must be a positive integer, got {value!r}")
    limit, offset = cfg.data.get("limit"), cfg.data.get("offset", 0)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ExperimentConfigError(f"data.limit must be a positive integer or null (all items), "
                                    f"got {limit!r}")
    if not isinstance(offset, int) or offset < 0:
        raise ExperimentConfigError(f"data.offset must be an integer ≥ 0, got {offset!r}")
    if not cfg.methods:
        raise ExperimentConfigError("methods is empty; e.g. methods=[logical,ctrlg]")
    rerank_rule(cfg)
    SearchOptions.from_config(gen, int(gen.get("num_beams", 1)), int(gen.num_samples))
    return {name: method_spec(cfg, name) for name in cfg.methods}


# ---------------------------------------------------------------------- one item's pieces
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
    ``instruct`` — the instruction of :func:`ctrlg.hmm.sampling.commongen_prompts` (the prompts
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


def load_judge(cfg: DictConfig) -> Judge | None:
    """The judge LM of ``judge`` (None when ``judge.weight`` is 0): ``judge.model`` (null: the
    embedded LM) with ``judge.adapter`` (null: none) in ``model.dtype``, reading each candidate
    as its prompt style continues (:func:`ctrlg.data.commongen_prompts.target_prefix`)."""
    if not rerank_rule(cfg).get("judge_weight"):
        return None
    judge_cfg = cfg.judge
    style = judge_style(judge_cfg)
    model, tokenizer = load_lm(OmegaConf.create({"name": judge_cfg.get("model"),
                                                 "adapter": judge_cfg.get("adapter"),
                                                 "dtype": cfg.model.get("dtype", "float32")}))
    return Judge(model, tokenizer, text_prefix=target_prefix(style["prompt_style"]))


def eos_ids(model, tokenizer) -> list[int]:
    """The EOS ids (:func:`ctrlg.vocab.eos_token_ids`: the tokenizer's, then the model's)."""
    return eos_token_ids(tokenizer, model)


def word_count(text: str) -> int:
    return len(text.split())


# ---------------------------------------------------------------------- one batch, one method
def batch_seed(seed: int, first_index: int, method: str) -> int:
    """The torch seed of one batch of one method (stable across processes and resumes)."""
    return zlib.crc32(f"{seed}:{first_index}:{method}".encode())


def decoding_options(gen, K: int, beams: int) -> dict:
    """``generate`` keywords: ancestral sampling (``beams`` = 1) or beam search of width
    max(B, K) keeping K beams, with ``length_penalty`` (HF: sum of log-probs / length^p) and
    ``no_repeat_ngram_size`` (0: off) — the paper's 128 beams, 0.2 and 4."""
    no_repeat = int(gen.get("no_repeat_ngram_size") or 0)
    extra = {"no_repeat_ngram_size": no_repeat} if no_repeat else {}
    if beams == 1:
        return dict(do_sample=True, temperature=gen.temperature, top_p=gen.top_p, top_k=0, **extra)
    return dict(do_sample=False, num_beams=max(beams, K),
                length_penalty=float(gen.get("length_penalty", 1.0)), **extra)


def decode_candidates(spec: dict, model, tokenizer, prompts: list[list[int]], constraints, hmm, cfg,
                      seed: int, processor_cache: dict | None = None
                      ) -> list[tuple[list[list[int]], list[float] | None]]:
    """Decode all ``prompts`` together (left-padded; item j's DFA ``constraints[j]`` guides its
    K rows; ``processor_cache`` lets the methods of one batch share a guide's tables): per item,
    its K samples/beams (cut at EOS) and their log p_lm(candidate | prompt) — summed during beam
    search (:mod:`ctrlg.beam_likelihood`), else by a second pass
    (:func:`ctrlg.sampler.lm_log_likelihood`); None when ``rerank: none``."""

    gen = cfg.generation
    K, beams = int(gen.num_samples), int(gen.get("num_beams", 1))
    eos = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    width = max(len(p) for p in prompts)
    check_context_length(model, width, gen.max_new_tokens, what="the longest prompt of the batch")
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                             device=model.device)
    decoding = decoding_options(gen, K, beams)
    min_new = int(cfg.constraint.min_new_tokens)
    processors, extra = [], (dict(min_new_tokens=min_new) if min_new else {})
    search = SearchOptions.from_config(gen, beams, K)
    bans, extra = search.bans(decoding, extra, width, eos)
    if spec["guide"] != "none":
        cache = {} if processor_cache is None else processor_cache
        head = spec["guide"] == "ctrlg" and spec["prior"] == "head"
        key = (spec["guide"], head)
        if key not in cache:  # methods of one batch with the same prior share the tables
            cache[key] = ConstraintLogitsProcessor(
                hmm if spec["guide"] == "ctrlg" else None, list(constraints), prompt_length=width,
                max_new_tokens=gen.max_new_tokens, min_new_tokens=min_new, eos_token_id=eos,
                mode=spec["guide"], precision=str(gen.get("precision", "float32")),
                use_kernel=guide_kernel(gen), beam_score=search.beam_score,
                prior=HeadPrior(hmm.prior_head, model, hmm.hidden_size) if head else None)
        proc = cache[key]
        proc.reset()
        proc.strength = float(spec.get("strength", 1.0))
        processors = [proc]
    recorder = None
    if rerank_from_search(model, decoding, cfg):   # each beam's log p_lm summed during the search
        recorder = BeamLogLikelihoods(width, len(prompts), eos)
        processors = [recorder, *processors]
    processors = search.processors(bans, processors)
    torch.manual_seed(seed)
    with torch.no_grad(), search.topk(model):
        out = model.generate(input_ids, attention_mask=attention,
                             max_new_tokens=gen.max_new_tokens, num_return_sequences=K,
                             pad_token_id=pad, eos_token_id=eos, logits_processor=processors,
                             **decoding, **extra)
    rows = out[:, width:].tolist()
    rerank = rerank_rule(cfg)["rerank"] != "none"
    decoded = []
    for j, prompt in enumerate(prompts):
        samples = [trim_at_eos(r, eos) for r in rows[j * K:(j + 1) * K]]
        scores = candidate_log_likelihoods(model, prompt, samples, recorder, j) if rerank else None
        decoded.append((samples, scores))
    return decoded


def guide_kernel(gen) -> bool | None:
    """``generation.guide_kernel``: auto (None: the Triton backward-table kernel on CUDA, the
    torch recurrence on the CPU), true or false (:class:`ctrlg.sampler.ConstraintLogitsProcessor`'s
    ``use_kernel``); the two agree up to float32 rounding (tests/test_kernel_backward.py)."""
    value = gen.get("guide_kernel", "auto")
    if value in (None, "auto"):
        return None
    if isinstance(value, bool):
        return value
    raise ExperimentConfigError(f"generation.guide_kernel must be auto, true or false; got {value!r}")


def prompt_determines_output(spec: dict, cfg) -> bool:
    """Whether a method's candidates depend on the prompt alone: no guide (the constraint only
    judges them afterwards) and beam search (no sampling, so no seed)."""
    return spec["guide"] == "none" and int(cfg.generation.get("num_beams", 1)) > 1


def generate_batch(spec: dict, model, tokenizer, prompts: list[list[int]], constraints, hmm, cfg,
                   seed: int, processor_cache: dict | None = None, judge: Judge | None = None,
                   judge_prompts: list[list[int]] | None = None,
                   prompt_memo: dict | None = None) -> list[dict]:
    """Decode all ``prompts`` together (:func:`decode_candidates`) and keep, per item, the best of
    its K samples/beams: constraint-satisfying first, then the highest log p_lm(candidate |
    prompt); with ``judge.weight`` > 0, plus a times the ``judge``'s log p(y | ``judge_prompts[j]``)
    (:func:`pick_candidate`).

    ``prompt_memo`` (a dict kept across batches): when :func:`prompt_determines_output` (an
    unguided method with beam search), each distinct prompt is decoded once and its candidates
    reused — with the BOS-only prompt of the adapted pipeline the unconstrained LM writes the same
    beams for every item, so a full split costs one search instead of one per item."""

    eos = eos_ids(model, tokenizer)
    if prompt_memo is not None and prompt_determines_output(spec, cfg):
        missing = list(dict.fromkeys(tuple(p) for p in prompts if tuple(p) not in prompt_memo))
        if missing:
            index = {p: j for j, p in enumerate(map(tuple, prompts))}
            found = decode_candidates(spec, model, tokenizer, [list(p) for p in missing],
                                      [constraints[index[p]] for p in missing], hmm, cfg, seed,
                                      processor_cache)
            prompt_memo.update(zip(missing, found))
        decoded = [prompt_memo[tuple(p)] for p in prompts]
    else:
        decoded = decode_candidates(spec, model, tokenizer, prompts, constraints, hmm, cfg, seed,
                                    processor_cache)
    rule = rerank_rule(cfg)
    keep_all = bool(cfg.get("save_candidates", False))
    results = []
    for j, ((samples, scores), constraint) in enumerate(zip(decoded, constraints)):
        accepted = [constraint.accepts(s) for s in samples]
        rerank = rule["rerank"] != "none"
        scores = list(scores) if rerank else [0.0] * len(samples)
        lengths = [len(s) for s in samples]
        judged = rule.get("judge_weight") and rerank
        texts = [candidate_text(tokenizer, s, eos) for s in samples] \
            if keep_all or judged or rule["rerank"] == "mbr" else None
        verdicts: dict[str, float] = {}

        def verdict(chosen: list[str], j=j) -> list[float]:
            values = judge.score(judge_prompts[j], chosen)
            verdicts.update(zip(chosen, values))
            return values

        if judged and (judge is None or judge_prompts is None):
            raise ExperimentConfigError("judge.weight > 0 but no judge LM was loaded")
        best = pick_candidate(scores, lengths, accepted, rule, texts, verdict if judged else None)
        text = texts[best] if texts else candidate_text(tokenizer, samples[best], eos)
        result = {"text": text, "accepted": accepted[best], "num_accepted": sum(accepted),
                  "log_likelihood": scores[best] if rerank else None, "words": word_count(text)}
        if judged:
            result["judge_log_likelihood"] = verdicts[text]
        if keep_all:
            result["candidates"] = [
                {"text": t, "log_likelihood": score if rerank else None, "tokens": n, "accepted": ok,
                 **({"judge_log_likelihood": verdicts[t]} if t in verdicts else {})}
                for t, score, n, ok in zip(texts, scores, lengths, accepted)]
        results.append(result)
    return results


def candidate_text(tokenizer, ids: list[int], eos: list[int]) -> str:
    """A candidate's text: its tokens without EOS, decoded and stripped."""
    return tokenizer.decode([t for t in ids if t not in eos], skip_special_tokens=True).strip()


RERANKS = ("lm_loglik", "mbr", "none")


def rerank_rule(cfg) -> dict:
    """The rule that keeps one candidate per item: ``rerank`` (lm_loglik | mbr | none), the
    length exponent p (``rerank_length_penalty``, 0 when absent), for mbr the temperature T
    (``mbr_temperature``, 1 when absent) and, when ``judge.weight`` a > 0, the judge's weight
    and shortlist size (``judge_weight``, ``judge_top_k``: :func:`pick_candidate`)."""
    rerank = str(cfg.get("rerank", "lm_loglik"))
    if rerank not in RERANKS:
        raise ExperimentConfigError(f"rerank must be one of {', '.join(RERANKS)}, got {rerank!r}")
    rule = {"rerank": rerank, "length_penalty": float(cfg.get("rerank_length_penalty", 0.0) or 0.0)}
    judge = cfg.get("judge") or {}
    weight = float(judge.get("weight", 0.0) or 0.0)
    if not (math.isfinite(weight) and weight >= 0):
        raise ExperimentConfigError(f"judge.weight must be a finite number ≥ 0, got {weight}")
    if weight:
        top_k = judge.get("top_k", 16)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ExperimentConfigError(f"judge.top_k must be a positive integer, got {top_k!r}")
        if rerank != "lm_loglik":
            raise ExperimentConfigError(f"judge.weight > 0 adds to the lm_loglik rerank; it does "
                                        f"not combine with rerank={rerank}")
        rule.update(judge_weight=weight, judge_top_k=int(top_k))
    if rerank == "mbr":
        rule["mbr_temperature"] = float(cfg.get("mbr_temperature", 1.0))
        if not rule["mbr_temperature"] > 0:
            raise ExperimentConfigError(f"mbr_temperature must be > 0, got {rule['mbr_temperature']}")
    return rule


def rerank_settings(cfg) -> dict:
    """The rerank's settings beyond ``rerank`` that are not at their defaults (p ≠ 0; T for
    mbr), so that runs from before they existed keep matching."""
    rule = rerank_rule(cfg)
    out = {"rerank_length_penalty": rule["length_penalty"]} if rule["length_penalty"] else {}
    if "mbr_temperature" in rule:
        out["mbr_temperature"] = rule["mbr_temperature"]
    if rule.get("judge_weight"):
        out["judge"] = OmegaConf.to_container(cfg.judge, resolve=True)
    return out


def rerank_score(log_likelihood: float, tokens: int, exponent: float) -> float:
    """The rerank's score of one candidate: log p_lm(y | prompt) / |y|^p, |y| its generated
    tokens (EOS included). p = 0 is the paper's summed log-likelihood; p = 1 the mean per token
    (the form of transformers' beam ``length_penalty``)."""
    return log_likelihood / max(tokens, 1) ** exponent if exponent else log_likelihood


def judge_shortlist(pool: list[int], scores: list[float], lengths: list[int], rule: dict,
                    texts: list[str]) -> list[int]:
    """The candidates a judge scores: the ``judge_top_k`` best of ``pool`` (the candidates that
    compete: :func:`pick_candidate`) by :func:`rerank_score`, one per distinct text, best first."""
    ranked = sorted(pool, key=lambda i: -rerank_score(scores[i], lengths[i], rule["length_penalty"]))
    distinct: dict[str, int] = {}
    for i in ranked:
        distinct.setdefault(texts[i], i)
    return list(distinct.values())[:int(rule["judge_top_k"])]


def pick_candidate(scores: list[float], lengths: list[int], accepted: list[bool],
                   rule: dict | float = 0.0, texts: list[str] | None = None,
                   judge: Callable[[list[str]], list[float]] | None = None) -> int:
    """The index of the kept candidate, among the constraint-satisfying ones (all of them when
    none satisfies): ``lm_loglik``, the highest :func:`rerank_score` (the first on ties);
    ``mbr``, minimum Bayes risk over those candidates (:func:`ctrlg.mbr.mbr_pick`: BLEU+1 on
    the metrics' tokens, weights softmax(rerank_score / T)); ``none``, the first. ``rule`` is
    :func:`rerank_rule`'s dict, or a bare length exponent for ``lm_loglik``.

    With ``judge_weight`` a > 0 in the rule, ``judge(texts)`` gives log p_judge(y | judge prompt)
    of the :func:`judge_shortlist` and the kept candidate is the shortlisted one of highest
    rerank_score(y) + a · log p_judge(y) (a product of experts: p_lm(y)^{1/|y|^p} · p_judge(y)^a)."""
    rule = {"rerank": "lm_loglik", "length_penalty": float(rule)} if not isinstance(rule, dict) else rule
    pool = [i for i, ok in enumerate(accepted) if ok] or list(range(len(scores)))
    if rule["rerank"] == "none":
        return pool[0]
    if rule.get("judge_weight"):
        if judge is None or texts is None:
            raise ExperimentConfigError("judge.weight > 0 needs a judge LM and the candidates' texts")
        shortlist = judge_shortlist(pool, scores, lengths, rule, texts)
        verdicts = judge([texts[i] for i in shortlist])
        combined = [rerank_score(scores[i], lengths[i], rule["length_penalty"])
                    + rule["judge_weight"] * v for i, v in zip(shortlist, verdicts)]
        return shortlist[max(range(len(shortlist)), key=lambda k: combined[k])]
    ranked = [rerank_score(scores[i], lengths[i], rule["length_penalty"]) for i in pool]
    if rule["rerank"] == "mbr":
        if texts is None:
            raise ExperimentConfigError("rerank=mbr needs the candidates' texts")
        tokens = [metrics.tokenize_for_eval(texts[i]).split() for i in pool]
        return pool[mbr_pick(tokens, ranked, temperature=rule["mbr_temperature"])]
    return pool[max(range(len(pool)), key=lambda k: ranked[k])]


def rerank_from_search(model, decoding: dict, cfg) -> bool:
    """Rerank with the log-likelihoods recorded during beam search
    (:mod:`ctrlg.beam_likelihood`) instead of a second LM pass: beam search whose options leave
    the LM's log-probabilities unscaled, unless ``rerank_pass: full`` asks for the second pass."""
    if cfg.rerank == "none" or str(cfg.get("rerank_pass", "recorded")) == "full":
        return False
    return records_lm_log_probs(model.generation_config, decoding)


# ---------------------------------------------------------------------- persistence
def _generation_config(cfg: DictConfig) -> dict:
    """The settings that decide the generations (only the specs of the methods in use; the
    rerank's further settings only when not at their defaults: :func:`rerank_settings`)."""
    out = {key: without_compute_settings(key, value)
           for key, value in generation_config(cfg, GENERATION_KEYS).items()}
    out.update(rerank_settings(cfg))
    specs = out.get("method_specs") or {}
    out["method_specs"] = {m: specs.get(m) for m in out.get("methods") or []}
    return out


# ---------------------------------------------------------------------- the run
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


def score_methods(records: list[dict], methods: list[str], specs: dict, cfg) -> tuple[dict, dict]:
    """The metric table (one row per method) and the paired-bootstrap intervals of each guided
    method − ``bootstrap.baseline`` (corpus metrics recomputed on every resample of items)."""

    with_meteor = cfg.metrics.meteor in ("auto", True) and metrics.java_available()
    refs = [r["references"] or [" ".join(r["concepts"])] for r in records]
    table = {}
    for method in methods:
        hyps = [r[method]["text"] for r in records]
        row = metrics.evaluate_generations(hyps, refs, [r[method]["accepted"] for r in records],
                                           with_meteor=with_meteor)
        row["keywords"] = metrics.success_rate(
            metrics.keyword_groups_covered(r[method]["text"], r["keyword_groups"]) for r in records)
        row["words"] = sum(r[method]["words"] for r in records) / len(records)
        row["seconds"] = sum(r["seconds"][method] for r in records)
        table[method] = row
    boot = cfg.bootstrap
    baseline = boot.baseline
    compared = [m for m in methods if m != baseline and specs[m]["guide"] == "ctrlg"]
    intervals = {}
    if baseline in methods and compared and boot.resamples:
        names = [m for m in metrics.CORPUS_METRICS if m != "meteor" or with_meteor]
        session = metrics.MeteorSession() if with_meteor else None
        try:
            intervals = paired_intervals(records, refs, baseline, compared, names, boot, session)
        finally:
            if session is not None:
                session.close()
    return table, intervals


def format_intervals(intervals: dict, baseline: str, confidence: float) -> str:
    rows = []
    for method, per_metric in intervals.items():
        row = {"pair": f"{method} − {baseline}"}
        for metric, ci in per_metric.items():
            row[metric] = interval_cell(ci)
        rows.append(row)
    columns = ["pair", *METRIC_NAMES]
    headers = ["paired bootstrap", *(interval_header(m, confidence) for m in METRIC_NAMES)]
    return format_table(rows, columns, headers)


def load_models(cfg: DictConfig, specs: dict):
    """(model, tokenizer, hmm): the LM and, when a method guides with it, the HMM (None
    otherwise), both on ``device``, checked to carry a prior head when a method uses
    ``prior=head``."""
    device = resolve_device(cfg.get("device", "cpu"))
    model, tokenizer = load_lm(cfg.model, device)
    needs_hmm = any(s["guide"] == "ctrlg" for s in specs.values())
    hmm = load_hmm(cfg.hmm, tokenizer).to(device) if needs_hmm else None
    heads = [m for m in cfg.methods if specs[m]["guide"] == "ctrlg" and specs[m]["prior"] == "head"]
    if heads and getattr(hmm, "prior_head", None) is None:
        raise ExperimentConfigError(f"method(s) {heads} use prior=head but the HMM "
                                    f"({cfg.hmm.get('path') or 'the embedded default'}) has no "
                                    f"prior head saved with it or named by hmm.prior_head; "
                                    f"train one with `python -m experiments.distill` (it does by "
                                    f"default; base_hmm=... for a head alone) or use the "
                                    f"filtering prior, e.g. methods=[logical,ctrlg_w075]")
    return model, tokenizer, hmm


def prepare_batch(batch: list, cfg: DictConfig, tokenizer, vocab_size: int, eos: list[int],
                  keep) -> list[tuple[dict, object, list[int]]]:
    """(record, constraint, prompt ids) of each item of ``batch`` whose constraint can be met
    within the token budget; an item whose cannot is reported on stderr and passed to ``keep``
    as skipped."""
    ready = []
    for index, example in batch:
        groups = keyword_groups(example, cfg.constraint)
        start = time.perf_counter()
        constraint = build_constraint(example, groups, tokenizer, cfg.constraint, vocab_size, eos[0])
        record = {"index": index, "concepts": list(example.concepts),
                  "keyword_groups": groups, "references": list(example.references),
                  "dfa_states": constraint.num_states,
                  "dfa_seconds": time.perf_counter() - start}
        reason = unsatisfiable_reason(constraint, cfg, eos)
        if reason is not None:
            print(f"item {index} ({', '.join(example.concepts)}): skipped, {reason}",
                  file=sys.stderr)
            keep({**record, "skipped": reason})
            continue
        record["seconds"] = {}
        ready.append((record, constraint, prompt_ids(example, tokenizer, cfg.model)))
    return ready


def decode_batch(ready: list, first_index: int, methods: list[str], specs: dict, model, tokenizer,
                 hmm, cfg: DictConfig, judge: Judge | None = None,
                 prompt_memo: dict | None = None) -> None:
    """Every method on the ``ready`` items of one batch (:func:`generate_batch`, seeded by
    :func:`batch_seed`; the methods share guide tables; ``prompt_memo[method]`` keeps the
    candidates of prompt-determined methods across batches); each record gets the method's
    output and its share of the batch's seconds."""
    if not ready:
        return
    shared: dict = {}
    style = None if judge is None else judge_style(cfg.judge)   # resolved once per batch
    judge_prompts = None if judge is None else \
        [judge_prompt_ids(record["concepts"], judge.tokenizer, style) for record, _, _ in ready]
    for method in methods:
        start = time.perf_counter()
        outputs = generate_batch(specs[method], model, tokenizer, [p for _, _, p in ready],
                                 [c for _, c, _ in ready], hmm, cfg,
                                 batch_seed(cfg.seed, first_index, method), shared, judge,
                                 judge_prompts,
                                 None if prompt_memo is None else prompt_memo.setdefault(method, {}))
        share = (time.perf_counter() - start) / len(ready)
        for (record, _, _), output in zip(ready, outputs):
            record[method] = output
            record["seconds"][method] = share
    for proc in shared.values():  # detach the prior heads' hooks from the LM
        if hasattr(proc.prior, "remove"):
            proc.prior.remove()


def decode_items(items: list, previous: list[dict], methods: list[str], specs: dict, model,
                 tokenizer, hmm, cfg: DictConfig, out_dir: Path,
                 judge: Judge | None = None) -> list[dict]:
    """Every item not in ``previous`` (the records of a resumed run), batch by batch
    (:func:`batches`); each finished record is appended to ``generations.jsonl`` at once.
    Returns all records, the previous ones first."""
    done = {r["index"] for r in previous}
    eos = eos_ids(model, tokenizer)
    vocab_size = hmm.vocab_size if hmm is not None else len(tokenizer)
    writer = RecordWriter(out_dir / "generations.jsonl", previous)
    records = list(previous)
    prompt_memo: dict = {}   # method -> prompt -> candidates (generate_batch)

    def keep(record: dict) -> None:
        writer.write(record)
        records.append(record)

    bar = progress(None, total=len(items), desc="commongen", initial=len(done & {i for i, _ in items}))
    try:
        for group in batches(items, int(cfg.batch_size)):
            batch = [(i, ex) for i, ex in group if i not in done]
            if not batch:
                continue
            ready = prepare_batch(batch, cfg, tokenizer, vocab_size, eos, keep)
            decode_batch(ready, group[0][0], methods, specs, model, tokenizer, hmm, cfg, judge,
                         prompt_memo)
            for record, _, _ in ready:
                keep(record)
            bar.update(len(batch))
    finally:
        bar.close()
        writer.close()
    return records


def reference_words(records: list[dict]) -> float:
    """The mean over items of each item's mean number of words per reference."""
    return sum(sum(map(word_count, r["references"])) / max(len(r["references"]), 1)
               for r in records) / len(records)


def print_tables(table: dict, intervals: dict, methods: list[str], cfg: DictConfig,
                 ref_words: float) -> None:
    """The metric table, the references' mean words and the paired-bootstrap intervals."""
    print(format_table([{"method": m, **table[m]} for m in methods], TABLE_COLUMNS, TABLE_HEADERS))
    print(f"references: {ref_words:.2f} words on average")
    if intervals:
        print(format_intervals(intervals, cfg.bootstrap.baseline, float(cfg.bootstrap.confidence)))


def report(records: list[dict], first_index: int, methods: list[str], specs: dict,
           cfg: DictConfig, out_dir: Path) -> dict:
    """Score the records that were not skipped (:func:`score_methods`), write ``metrics.json``
    and print the tables; returns ``{method: metrics row}``."""
    scored = [r for r in records if "skipped" not in r]
    skipped = [{"index": r["index"], "concepts": r["concepts"], "reason": r["skipped"]}
               for r in records if "skipped" in r]
    if not scored:
        raise ExperimentConfigError(f"all {len(records)} items were skipped (unsatisfiable within "
                                    f"generation.max_new_tokens={cfg.generation.max_new_tokens})")
    table, intervals = score_methods(scored, methods, specs, cfg)
    ref_words = reference_words(scored)
    write_json(out_dir / "metrics.json", {"items": len(scored), "skipped": skipped,
                                          "scales": metrics.SCALES,
                                          "reference_words": ref_words, "methods": table,
                                          "bootstrap": {"baseline": cfg.bootstrap.baseline,
                                                        "intervals": intervals}})
    print(f"CommonGen ({len(scored)} items from index {first_index}, {len(skipped)} skipped, "
          f"K={cfg.generation.num_samples}, beams={cfg.generation.get('num_beams', 1)}, "
          f"max_new_tokens={cfg.generation.max_new_tokens}) → {out_dir}")
    print_tables(table, intervals, methods, cfg, ref_words)
    return table


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """The whole experiment; returns ``{method: metrics row}`` and writes the result files."""
    specs = check_config(cfg)
    resume_dir = find_resume_dir(cfg, out_dir, _generation_config)
    methods = start_run(cfg, out_dir, list(specs))
    items = select_items(cfg)
    previous = read_records(resume_dir) if resume_dir is not None else []
    model, tokenizer, hmm = load_models(cfg, specs)
    judge = load_judge(cfg)
    records = decode_items(items, previous, methods, specs, model, tokenizer, hmm, cfg, out_dir,
                           judge)
    return report(records, items[0][0], methods, specs, cfg, out_dir)


@hydra.main(version_base=None, config_path="../configs", config_name="commongen")
@report_errors
def main(cfg: DictConfig) -> None:
    run(cfg, hydra_output_dir())


if __name__ == "__main__":
    main()
