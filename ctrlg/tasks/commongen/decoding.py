"""Decoding one batch of CommonGen items with one method, and keeping one output per item.

All prompts of a batch are decoded together, left-padded; item j's constraint DFA guides its K
rows (:class:`ctrlg.ConstraintLogitsProcessor` takes one DFA per input row). Sampling draws K
samples; beam search of width max(B, K) keeps K beams. Each candidate's log p_lm(y | prompt) is
summed during beam search (:mod:`ctrlg.lm.beam_likelihood`) or computed by a second LM pass;
:func:`ctrlg.tasks.commongen.rerank.pick_candidate` keeps one. Each batch draws from its own seed
(run seed, first item, method), so a resumed run reproduces an uninterrupted one.

May import: the library below :mod:`ctrlg.tasks` and :mod:`ctrlg.tasks.records` / :mod:`ctrlg.tasks.config`; within
this package, :mod:`~ctrlg.tasks.commongen.items`, :mod:`~ctrlg.tasks.commongen.rerank`,
:mod:`~ctrlg.tasks.commongen.methods`.
"""

from __future__ import annotations

import copy
import zlib

import torch

from ctrlg.errors import ExperimentConfigError
from ctrlg.guide.priors import HeadPrior
from ctrlg.lm.beam_likelihood import BeamLogLikelihoods, records_lm_log_probs
from ctrlg.lm.judge import Judge
from ctrlg.memory import check_lm_fits
from ctrlg.sampler import ConstraintLogitsProcessor, candidate_log_likelihoods, trim_at_eos
from ctrlg.tasks.commongen.items import word_count
from ctrlg.tasks.commongen.methods import candidate_pool, guide_kernel, widening
from ctrlg.tasks.commongen.rerank import pick_candidate, rerank_rule, shortlisted_texts
from ctrlg.tasks.search_options import SearchOptions
from ctrlg.validation import check_context_length
from ctrlg.vocab import eos_token_ids, lm_vocab_size

__all__ = ["with_ended", "eos_ids", "batch_seed", "decoding_options", "decode_candidates", "rerank_from_search", "prompt_determines_output", "widen_low_scoring", "generate_batch", "candidate_text"]


def eos_ids(model, tokenizer) -> list[int]:
    """The EOS ids (:func:`ctrlg.vocab.eos_token_ids`: the tokenizer's, then the model's)."""
    return eos_token_ids(tokenizer, model)


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
                      seed: int, processor_cache: dict | None = None, ended: list | None = None
                      ) -> list[tuple[list[list[int]], list[float] | None]]:
    """Decode all ``prompts`` together (left-padded; item j's DFA ``constraints[j]`` guides its
    K rows; ``processor_cache`` lets the methods of one batch share a guide's tables): per item,
    its K samples/beams (cut at EOS) and their log p_lm(candidate | prompt) — summed during beam
    search (:mod:`ctrlg.lm.beam_likelihood`), else by a second pass
    (:func:`ctrlg.sampler.lm_log_likelihood`); None when ``rerank: none``. ``ended`` (a list):
    appended, per item, every hypothesis the search scored ending with EOS that the item's
    constraint accepts, with its log p_lm (:meth:`BeamLogLikelihoods.ended_hypotheses`;
    ExperimentConfigError when the search records none), for :func:`with_ended`."""

    gen = cfg.generation
    K, beams = int(gen.num_samples), int(gen.get("num_beams", 1))
    eos = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    width = max(len(p) for p in prompts)
    check_context_length(model, width, gen.max_new_tokens, what="the longest prompt of the batch")
    check_lm_fits(model, rows=len(prompts) * max(beams, K), prompt_length=width,
                  max_new_tokens=int(gen.max_new_tokens), vocab_size=lm_vocab_size(model),
                  scored_rows=K, what=f"a batch of {len(prompts)} items × {max(beams, K)} rows",
                  advice="lower batch_size, generation.num_samples / generation.num_beams or "
                         "generation.max_new_tokens")
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
        proc.keep_top = search.keep_top()              # None unless the lookahead ranks beams
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
        if ended is not None:
            if recorder is None:
                raise ExperimentConfigError(
                    "generation.candidate_pool=ended needs the log-likelihoods recorded during "
                    "beam search, and these decoding options rescale the LM's scores (e.g. "
                    "repetition_penalty): use candidate_pool=beams")
            ended.append([(tokens, value) for tokens, value in recorder.ended_hypotheses(j)
                          if constraints[j].accepts(tokens)])
    return decoded


def with_ended(decoded: list, ended: list) -> tuple[list, list[int]]:
    """Each item's candidates followed by its ``ended`` hypotheses (:func:`decode_candidates`)
    that are not among them (each token sequence once), and per item the number of candidates
    that came from the search's returned beams (the rest are ended hypotheses)."""
    out, returned = [], []
    for (samples, scores), pool in zip(decoded, ended):
        seen = {tuple(s) for s in samples}
        extra = []
        for tokens, value in pool:
            if tuple(tokens) not in seen:
                seen.add(tuple(tokens))
                extra.append((tokens, value))
        out.append((list(samples) + [t for t, _ in extra], list(scores) + [v for _, v in extra]))
        returned.append(len(samples))
    return out, returned


def rerank_from_search(model, decoding: dict, cfg) -> bool:
    """Rerank with the log-likelihoods recorded during beam search
    (:mod:`ctrlg.lm.beam_likelihood`) instead of a second LM pass: beam search whose options leave
    the LM's log-probabilities unscaled, unless ``rerank_pass: full`` asks for the second pass."""
    if cfg.rerank == "none" or str(cfg.get("rerank_pass", "recorded")) == "full":
        return False
    return records_lm_log_probs(model.generation_config, decoding)


def widen_low_scoring(decoded: list, widen: tuple[float, int], spec: dict, model, tokenizer,
                      prompts: list[list[int]], constraints, hmm, cfg, seed: int,
                      ended: list | None = None) -> set[int]:
    """Iterative widening (:func:`widening`): the items whose best satisfying candidate (by
    summed log p_lm, whatever the rerank rule) scores below τ are
    decoded again with W beams (W candidates), and their new candidates are appended to
    ``decoded`` in place (and their ended hypotheses to ``ended[j]``, when given). The
    decision reads the returned beams only. Returns the indices of the widened items."""
    threshold, width = widen
    low = []
    for j, ((samples, scores), constraint) in enumerate(zip(decoded, constraints)):
        accepted = [constraint.accepts(s) for s in samples]
        best = pick_candidate(scores, [len(s) for s in samples], accepted, 0.0)   # max log p_lm
        if scores[best] < threshold:
            low.append(j)
    if low:
        wide = copy.deepcopy(cfg)
        wide.generation.num_beams = width
        wide.generation.num_samples = width
        wide_ended = None if ended is None else []
        more = decode_candidates(spec, model, tokenizer, [prompts[j] for j in low],
                                 [constraints[j] for j in low], hmm, wide, seed, ended=wide_ended)
        for j, (samples, scores) in zip(low, more):
            decoded[j] = (decoded[j][0] + samples, list(decoded[j][1]) + list(scores))
        for j, pool in zip(low, wide_ended or []):
            ended[j] = ended[j] + pool
    return set(low)


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
    beams for every item, so a full split costs one search instead of one per item.

    ``generation.candidate_pool``: ``beams`` (default) chooses among the returned beams;
    ``ended`` also among every hypothesis the search scored ending with EOS that the constraint
    accepts (:func:`with_ended`; beam search with the recorder and a rerank only), marked
    ``"ended": true`` among the saved candidates."""

    eos = eos_ids(model, tokenizer)
    ended = [] if candidate_pool(cfg) == "ended" else None
    if prompt_memo is not None and prompt_determines_output(spec, cfg):
        missing = list(dict.fromkeys(tuple(p) for p in prompts if tuple(p) not in prompt_memo))
        if missing:
            index = {p: j for j, p in enumerate(map(tuple, prompts))}
            found = decode_candidates(spec, model, tokenizer, [list(p) for p in missing],
                                      [constraints[index[p]] for p in missing], hmm, cfg, seed,
                                      processor_cache)
            prompt_memo.update(zip(missing, found))
        decoded = [prompt_memo[tuple(p)] for p in prompts]
        ended = None
    else:
        decoded = decode_candidates(spec, model, tokenizer, prompts, constraints, hmm, cfg, seed,
                                    processor_cache, ended=ended)
    widen = widening(spec, cfg)
    widened = None if widen is None else widen_low_scoring(
        decoded, widen, spec, model, tokenizer, prompts, constraints, hmm, cfg, seed, ended=ended)
    returned = None
    if ended is not None:
        decoded, returned = with_ended(decoded, ended)
    rule = rerank_rule(cfg)
    keep_all = bool(cfg.get("save_candidates", False))
    rerank = rule["rerank"] != "none"
    judged = bool(rule.get("judge_weight")) and rerank
    if judged and (judge is None or judge_prompts is None):
        raise ExperimentConfigError("judge.weight > 0 but no judge LM was loaded")
    accepted_of = [[c.accepts(s) for s in samples] for (samples, _), c in zip(decoded, constraints)]
    texts_of = [[candidate_text(tokenizer, s, eos) for s in samples]
                if keep_all or judged or rule["rerank"] == "mbr" else None for samples, _ in decoded]
    if judged:   # every item's shortlist scored together: one judge pass for the batch
        judge.score_many([
            (judge_prompts[j], shortlisted_texts(list(scores), [len(s) for s in samples], accepted, rule, texts))
            for j, ((samples, scores), accepted, texts) in enumerate(zip(decoded, accepted_of, texts_of))])
    results = []
    for j, (samples, scores) in enumerate(decoded):
        accepted, texts = accepted_of[j], texts_of[j]
        scores = list(scores) if rerank else [0.0] * len(samples)
        lengths = [len(s) for s in samples]
        verdicts: dict[str, float] = {}

        def verdict(chosen: list[str], j=j) -> list[float]:
            values = judge.score(judge_prompts[j], chosen)
            verdicts.update(zip(chosen, values))
            return values

        best = pick_candidate(scores, lengths, accepted, rule, texts, verdict if judged else None)
        text = texts[best] if texts else candidate_text(tokenizer, samples[best], eos)
        result = {"text": text, "accepted": accepted[best], "num_accepted": sum(accepted),
                  "log_likelihood": scores[best] if rerank else None, "words": word_count(text)}
        if judged:
            result["judge_log_likelihood"] = verdicts[text]
        if widened is not None:
            result["widened"] = j in widened
        if keep_all:
            result["candidates"] = [
                {"text": t, "log_likelihood": score if rerank else None, "tokens": n, "accepted": ok,
                 **({"judge_log_likelihood": verdicts[t]} if t in verdicts else {}),
                 **({"ended": True} if returned is not None and i >= returned[j] else {})}
                for i, (t, score, n, ok) in enumerate(zip(texts, scores, lengths, accepted))]
        results.append(result)
    return results


def candidate_text(tokenizer, ids: list[int], eos: list[int]) -> str:
    """A candidate's text: its tokens without EOS, decoded and stripped."""
    return tokenizer.decode([t for t in ids if t not in eos], skip_special_tokens=True).strip()
