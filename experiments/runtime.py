"""Time per generated token against DFA size and sequence length (Ctrl-G Fig. 6).

    python -m experiments.runtime [hmm.hidden_size=256] [batch_size=8]

For each point, the same ``generate`` call (ancestral sampling, exactly ``max_new_tokens`` tokens
per row, EOS suppressed) runs twice: with the LM alone and with
:class:`ctrlg.sampler.ConstraintLogitsProcessor` (Ctrl-G mode) on the constraint
"every concept of ``concepts`` occurs ∧ 1 ≤ words ≤ max_words" (:func:`ctrlg.dfa.keywords` ∧
:func:`ctrlg.dfa.word_count`). Per-token time = wall time / tokens per row; the guidance overhead is
the difference; the one-off table build (backward tables W_r for r ≤ n, DESIGN.md) is timed apart.
By design the per-token guidance cost does not depend on the number of DFA states nor on t.

Writes ``runtime.json``, ``runtime.png`` (two panels) and ``config.yaml`` in the run directory.
"""

from __future__ import annotations

import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from ctrlg.tasks.config import load_hmm, load_lm
from ctrlg.tasks.records import format_table, progress, write_json
from ctrlg.validation import check_context_length
from experiments.common import (hydra_output_dir, report_errors, save_resolved_config,
                                seed_everything)


def random_hmm(hidden_size: int, vocab_size: int, seed: int):
    """A random HMM (Dirichlet-like rows) of the given size, for timing only."""
    from ctrlg import HMM

    generator = torch.Generator().manual_seed(seed)
    rows = lambda *shape: torch.rand(*shape, generator=generator) + 1e-3  # noqa: E731
    normalise = lambda t: t / t.sum(-1, keepdim=True)  # noqa: E731
    return HMM.from_params(normalise(rows(hidden_size)), normalise(rows(hidden_size, hidden_size)),
                           normalise(rows(hidden_size, vocab_size)))


def constraint(tokenizer, concepts: str, max_words: int, vocab_size: int):
    from ctrlg import dfa
    from ctrlg.dfa.words import parse_concepts

    groups = [dfa.inflections(word, pos) for word, pos in parse_concepts(list(concepts))]
    return dfa.intersect(dfa.keywords(groups, tokenizer, vocab_size=vocab_size),
                         dfa.word_count(1, max_words, tokenizer, vocab_size=vocab_size))


@torch.no_grad()
def time_point(model, prompt_ids, n: int, batch: int, repeats: int, processor=None) -> float:
    """Seconds per generated token (per row), minimum over ``repeats`` calls."""
    check_context_length(model, len(prompt_ids), n)
    input_ids = torch.tensor([prompt_ids] * batch)
    best = float("inf")
    for repeat in range(repeats):
        torch.manual_seed(repeat)
        if processor is not None:
            processor.reset()
        start = time.perf_counter()
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                             top_k=0, max_new_tokens=n, min_new_tokens=n,
                             logits_processor=[processor] if processor is not None else None,
                             pad_token_id=model.generation_config.eos_token_id)
        elapsed = time.perf_counter() - start
        best = min(best, elapsed / (out.shape[1] - input_ids.shape[1]))
    return best


def measure(model, hmm, prompt_ids, dfa, n: int, cfg) -> dict:
    from ctrlg.sampler import ConstraintLogitsProcessor

    start = time.perf_counter()
    processor = ConstraintLogitsProcessor(hmm, dfa, prompt_length=len(prompt_ids),
                                          max_new_tokens=n, min_new_tokens=n, eos_token_id=None)
    build = time.perf_counter() - start
    lm = time_point(model, prompt_ids, n, cfg.batch_size, cfg.repeats)
    guided = time_point(model, prompt_ids, n, cfg.batch_size, cfg.repeats, processor)
    return {"dfa_states": dfa.num_states, "dfa_exceptions": dfa.num_exceptions,
            "max_new_tokens": n, "lm_ms": 1e3 * lm, "ctrlg_ms": 1e3 * guided,
            "overhead_ms": 1e3 * (guided - lm), "overhead_pct": 100 * (guided - lm) / lm,
            "table_build_s": build}


def plot(dfa_rows, length_rows, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, rows, key, label in ((axes[0], dfa_rows, "dfa_states", "DFA states"),
                                 (axes[1], length_rows, "max_new_tokens", "sequence length")):
        xs = [r[key] for r in rows]
        ax.plot(xs, [r["lm_ms"] for r in rows], "o-", label="LM alone")
        ax.plot(xs, [r["ctrlg_ms"] for r in rows], "s-", label="LM + Ctrl-G")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(label)
        ax.set_ylabel("ms per token")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(cfg: DictConfig, out_dir: Path) -> dict:
    from ctrlg.data import CommonGenExample, parse_concept_set
    from ctrlg.tasks.commongen.items import prompt_ids as commongen_prompt

    seed_everything(cfg.seed)
    save_resolved_config(cfg, out_dir)
    model, tokenizer = load_lm(cfg.model)
    if cfg.hmm.get("hidden_size"):
        hmm = random_hmm(int(cfg.hmm.hidden_size), len(tokenizer), cfg.seed)
    else:
        hmm = load_hmm(cfg.hmm, tokenizer)
    key = "#".join(cfg.concepts)
    concepts, pos = parse_concept_set(key)
    example = CommonGenExample(concepts, pos, (), key)
    prompt = commongen_prompt(example, tokenizer, cfg.model)
    V = hmm.vocab_size

    dfa_rows = []
    for max_words in progress(list(cfg.dfa_sweep.max_words), desc="DFA size"):
        dfa = constraint(tokenizer, cfg.concepts, int(max_words), V)
        dfa_rows.append({"max_words": int(max_words),
                         **measure(model, hmm, prompt, dfa, int(cfg.dfa_sweep.max_new_tokens), cfg)})
    length_rows = []
    dfa = constraint(tokenizer, cfg.concepts, int(cfg.length_sweep.max_words), V)
    for n in progress(list(cfg.length_sweep.max_new_tokens), desc="length"):
        length_rows.append({"max_words": int(cfg.length_sweep.max_words),
                            **measure(model, hmm, prompt, dfa, int(n), cfg)})

    title = (f"time per token, batch {cfg.batch_size}, HMM h={hmm.hidden_size}, "
             f"{torch.get_num_threads()} threads")
    plot(dfa_rows, length_rows, out_dir / "runtime.png", title)
    result = {"hidden_size": hmm.hidden_size, "batch_size": cfg.batch_size,
              "dfa_sweep": dfa_rows, "length_sweep": length_rows}
    write_json(out_dir / "runtime.json", result)
    columns = ["dfa_states", "dfa_exceptions", "max_new_tokens", "lm_ms", "ctrlg_ms",
               "overhead_pct", "table_build_s"]
    headers = ["DFA states", "exceptions", "tokens", "LM ms/tok", "LM+Ctrl-G ms/tok",
               "overhead %", "tables s"]
    print(f"Runtime ({title}) → {out_dir}")
    print("vs DFA size:")
    print(format_table(dfa_rows, columns, headers))
    print("vs sequence length:")
    print(format_table(length_rows, columns, headers))
    return result


@hydra.main(version_base=None, config_path="../configs", config_name="runtime")
@report_errors
def main(cfg: DictConfig) -> None:
    run(cfg, hydra_output_dir())


if __name__ == "__main__":
    main()
