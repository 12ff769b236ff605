"""CommonGen with the embedded LM (Ctrl-G §4.1): generate a sentence using every concept.

    python -m experiments.commongen [data.limit=N] [data.path=items.jsonl] [generation.num_samples=K]

For each concept set: the instruction "Write a sentence using the words: field, look, stand." in
the LM's chat template (the prompt the embedded HMM was distilled on, built by
:func:`ctrlg.hmm.sampling.commongen_prompts`); a constraint DFA "every concept occurs as a whole
word in one of its inflected forms, then EOS" (:func:`ctrlg.dfa.commongen_constraint` over keyword
groups from :func:`ctrlg.dfa.inflections`, lemminflect), at least ``constraint.min_words`` words;
K samples per method, drawn as one batch, reranked by the LM log-likelihood log p_lm(y | prompt)
with constraint-satisfying samples first. Methods:

* ``unconstrained`` — plain ancestral sampling from the LM;
* ``logical`` — the LM with tokens that make the constraint unsatisfiable within the budget masked
  (Outlines-style logical masking: ``mode="logical"``);
* ``ctrlg`` — p(v | x≤t, α) ∝ p_lm(v | x≤t) · p_hmm(α | x≤t, v) with the HMM.

Prints BLEU-4 / ROUGE-L / CIDEr / METEOR (when Java is present) / constraint success % per method
and writes ``generations.jsonl``, ``metrics.json`` and ``config.yaml`` into Hydra's run directory.
"""

from __future__ import annotations

import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from ctrlg.vocab import eos_token_ids

from experiments.common import (format_table, hydra_output_dir, load_hmm, load_lm, progress,
                                start_run, write_json, write_jsonl)

METHODS = ("unconstrained", "logical", "ctrlg")
TABLE_COLUMNS = ["method", "bleu4", "rouge_l", "cider", "meteor", "success", "keywords",
                 "seconds"]
TABLE_HEADERS = ["method", "BLEU-4", "ROUGE-L", "CIDEr", "METEOR", "success %",
                 "all words %", "time s"]


def keyword_groups(example, constraint_cfg) -> list[list[str]]:
    """One group of accepted surface forms per concept: the lemma and, with
    ``constraint.inflections``, its inflections (:func:`ctrlg.dfa.inflections`, lemminflect)."""
    from ctrlg import dfa

    if not constraint_cfg.inflections:
        return [[lemma] for lemma in example.concepts]
    return [list(dfa.inflections(lemma, pos)) for lemma, pos in zip(example.concepts, example.pos)]


def build_constraint(example, groups, tokenizer, constraint_cfg, vocab_size: int, eos: int):
    """keywords(groups) ∧ min_words ≤ words ≤ max_words ∧ EOS ends the generation."""
    from ctrlg import dfa

    if constraint_cfg.inflections:
        concepts = [f"{c}_{p[0]}" if p else c for c, p in zip(example.concepts, example.pos)]
        return dfa.commongen_constraint(tokenizer, concepts, min_words=constraint_cfg.min_words,
                                        max_words=constraint_cfg.max_words, eos_token_id=eos,
                                        vocab_size=vocab_size)
    return dfa.intersect(dfa.keywords(tokenizer, groups, vocab_size=vocab_size),
                         dfa.word_count(tokenizer, constraint_cfg.min_words,
                                        constraint_cfg.max_words, vocab_size=vocab_size),
                         dfa.eos(eos, vocab_size, required=True))


def prompt_ids(example, tokenizer, use_chat_template: bool) -> list[int]:
    """The instruction of :func:`ctrlg.hmm.sampling.commongen_prompts` (the prompt style the
    embedded HMM was distilled on), in the chat template when the model has one."""
    from ctrlg.hmm.sampling import commongen_prompts

    (prompt,) = commongen_prompts([" ".join(example.concepts)],
                                  tokenizer if use_chat_template else None)
    return tokenizer(prompt, add_special_tokens=not use_chat_template)["input_ids"]


def eos_ids(model, tokenizer) -> list[int]:
    """The EOS ids (:func:`ctrlg.vocab.eos_token_ids`: the tokenizer's, then the model's)."""
    return eos_token_ids(tokenizer, model)


def trim_at_eos(tokens: list[int], eos: list[int]) -> list[int]:
    """Tokens up to and including the first EOS (padding after it dropped)."""
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[:index + 1]
    return tokens


def best_sample(method: str, model, tokenizer, prompt: list[int], constraint, hmm, cfg,
                seed: int) -> dict:
    """Draw K samples (or, with ``generation.num_beams`` > 1, keep K beams) with ``method`` and
    keep the best: constraint-satisfying candidates first, then the highest LM log-likelihood
    log p_lm(candidate | prompt) (:func:`ctrlg.sampler.rerank`)."""
    import ctrlg
    from ctrlg.sampler import lm_log_likelihood

    gen = cfg.generation
    K = int(gen.num_samples)
    beams = int(gen.get("num_beams", 1))
    decoding = (dict(do_sample=True, temperature=gen.temperature, top_p=gen.top_p, top_k=0)
                if beams == 1 else dict(do_sample=False, num_beams=max(beams, K)))
    eos = eos_ids(model, tokenizer)
    if method == "unconstrained":
        input_ids = torch.tensor([prompt])
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                 max_new_tokens=gen.max_new_tokens, num_return_sequences=K,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=eos,
                                 **decoding)
        samples = [trim_at_eos(r, eos) for r in out[:, len(prompt):].tolist()]
        accepted = [constraint.accepts(s) for s in samples]
        scores = lm_log_likelihood(model, prompt, samples) if cfg.rerank != "none" else [0.0] * K
        pool = [i for i in range(K) if accepted[i]] or list(range(K))
        best = max(pool, key=lambda i: scores[i]) if cfg.rerank != "none" else 0
        body = [t for t in samples[best] if t not in eos]
        return {"text": tokenizer.decode(body, skip_special_tokens=True).strip(),
                "accepted": accepted[best], "num_accepted": sum(accepted),
                "log_likelihood": scores[best]}
    results = ctrlg.generate(model, tokenizer, prompt, constraint,
                             hmm=hmm if method == "ctrlg" else None,
                             mode="ctrlg" if method == "ctrlg" else "logical",
                             max_new_tokens=gen.max_new_tokens,
                             min_new_tokens=cfg.constraint.min_new_tokens, num_samples=K,
                             seed=seed, rerank=cfg.rerank != "none", **decoding)
    if not results:  # cannot happen when the budget allows acceptance; reported, not hidden
        return {"text": "", "accepted": False, "num_accepted": 0, "log_likelihood": None}
    best = results[0]
    return {"text": best.text.strip(), "accepted": constraint.accepts(best.token_ids),
            "num_accepted": len(results), "log_likelihood": best.lm_log_likelihood}


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """The whole experiment; returns ``{method: metrics row}`` and writes the result files."""
    from ctrlg import metrics
    from ctrlg.data import load_commongen

    methods = start_run(cfg, out_dir, METHODS)
    examples = load_commongen(cfg.data.path, limit=cfg.data.limit)
    model, tokenizer = load_lm(cfg.model)
    hmm = load_hmm(cfg.hmm, tokenizer) if "ctrlg" in methods else None
    eos = eos_ids(model, tokenizer)

    vocab_size = hmm.vocab_size if hmm is not None else len(tokenizer)
    records, seconds = [], {m: 0.0 for m in methods}
    for index, example in enumerate(progress(examples, desc="commongen")):
        groups = keyword_groups(example, cfg.constraint)
        start = time.perf_counter()
        constraint = build_constraint(example, groups, tokenizer, cfg.constraint, vocab_size,
                                      eos[0])
        build_seconds = time.perf_counter() - start
        prompt = prompt_ids(example, tokenizer, cfg.model.chat_template)
        record = {"index": index, "concepts": list(example.concepts), "keyword_groups": groups,
                  "references": list(example.references), "dfa_states": constraint.num_states,
                  "dfa_seconds": build_seconds}
        for method in methods:
            start = time.perf_counter()
            record[method] = best_sample(method, model, tokenizer, prompt, constraint, hmm, cfg,
                                         seed=cfg.seed * 100_003 + index)
            seconds[method] += time.perf_counter() - start
        records.append(record)

    with_meteor = cfg.metrics.meteor in ("auto", True)
    table = {}
    for method in methods:
        hyps = [r[method]["text"] for r in records]
        refs = [r["references"] or [" ".join(r["concepts"])] for r in records]
        row = metrics.evaluate_generations(hyps, refs, [r[method]["accepted"] for r in records],
                                           with_meteor=with_meteor)
        row["keywords"] = metrics.success_rate(
            metrics.keyword_groups_covered(r[method]["text"], r["keyword_groups"]) for r in records)
        row["seconds"] = seconds[method]
        table[method] = row

    write_jsonl(out_dir / "generations.jsonl", records)
    write_json(out_dir / "metrics.json", {"items": len(records), "methods": table})
    rows = [{"method": m, **table[m]} for m in methods]
    print(f"CommonGen ({len(records)} items, K={cfg.generation.num_samples}, "
          f"max_new_tokens={cfg.generation.max_new_tokens}) → {out_dir}")
    print(format_table(rows, TABLE_COLUMNS, TABLE_HEADERS))
    return table


@hydra.main(version_base=None, config_path="../configs", config_name="commongen")
def main(cfg: DictConfig) -> None:
    run(cfg, hydra_output_dir())


if __name__ == "__main__":
    main()
