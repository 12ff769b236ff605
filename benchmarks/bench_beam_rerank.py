"""Cost of reranking every beam by the LM (the paper's CommonGen decoding): the log-likelihoods
summed during beam search (:mod:`ctrlg.lm.beam_likelihood`) against a second LM pass over every
finished beam (:func:`ctrlg.sampler.rerank`), measured in one process.

    python -m benchmarks.bench_beam_rerank                 # 32 and 128 beams, 2 rounds

Setting: the adapted CommonGen pipeline (SmolLM2-135M-Instruct + the ``commongen-human-balanced``
adapter in bfloat16; the recorded run used the earlier ``commongen`` adapter; the h = 256 adapted HMM), prompt = BOS, ``dfa.commongen_constraint`` of one dev concept set,
5–32 new tokens, length_penalty 0.2, no_repeat_ngram_size 4, one torch thread. Per round and
width, in turn: ``ctrlg.generate(..., rank_by_lm=True)`` (recorded sums; the recorder copies the
[B, V] scores once per step) and ``rank_by_lm=False`` followed by ``ctrlg.sampler.rerank`` (a
forward pass over B beams of ≤ 33 tokens, ≈ 2 · 135M · B · length FLOPs). The ratio is the
median over rounds of full / recorded seconds; the script also checks that both choose the same
best output. Writes ``benchmarks/results/bench_beam_rerank.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

CONCEPTS = ["field_N", "look_V", "stand_V"]     # CommonGen dev item 0


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main(argv=None) -> dict:
    import ctrlg
    from ctrlg import dfa
    from ctrlg.hmm import load_embedded_hmm
    from ctrlg.lm.models import load_model, load_tokenizer
    from ctrlg.sampler import rerank
    from ctrlg.vocab import eos_token_ids

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beams", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/bench_beam_rerank.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    tokenizer = load_tokenizer(None)
    model = load_model(None, dtype=torch.bfloat16, adapter="commongen-human-balanced").eval()
    hmm = load_embedded_hmm("commongen-adapted")
    eos = eos_token_ids(tokenizer, model)
    constraint = dfa.commongen_constraint(CONCEPTS, tokenizer, min_words=1, eos_token_id=eos[0],
                                          vocab_size=hmm.vocab_size)
    prompt = tokenizer("<|endoftext|>", add_special_tokens=False).input_ids
    options = dict(hmm=hmm, max_new_tokens=32, min_new_tokens=5, length_penalty=0.2,
                   no_repeat_ngram_size=4, eos_token_id=eos, prior_head=None)

    seconds = {(b, way): [] for b in args.beams for way in ("recorded", "full")}
    same_best = {}
    for _ in range(args.repeats):
        for beams in args.beams:
            kw = dict(options, num_beams=beams, num_samples=beams)
            t, recorded = _timed(lambda: ctrlg.generate(model, tokenizer, prompt, constraint,
                                                        rank_by_lm=True, **kw))
            seconds[beams, "recorded"].append(t)
            t, plain = _timed(lambda: ctrlg.generate(model, tokenizer, prompt, constraint,
                                                     rank_by_lm=False, **kw))
            t_rerank, ranked = _timed(lambda: rerank(model, prompt, [g.token_ids for g in plain]))
            seconds[beams, "full"].append(t + t_rerank)
            same_best[beams] = recorded[0].token_ids == ranked[0][1]
    table = []
    for beams in args.beams:
        ratios = [f / r for f, r in zip(seconds[beams, "full"], seconds[beams, "recorded"])]
        table.append({"beams": beams,
                      "recorded_s": statistics.median(seconds[beams, "recorded"]),
                      "second_pass_s": statistics.median(seconds[beams, "full"]),
                      "speedup_median": statistics.median(ratios),
                      "same_best_output": same_best[beams]})
        print(f"{beams:4d} beams: recorded {table[-1]['recorded_s']:6.2f} s, second pass "
              f"{table[-1]['second_pass_s']:6.2f} s per item, ×{table[-1]['speedup_median']:.2f}, "
              f"same best: {same_best[beams]}")
    result = {"threads": 1, "repeats": args.repeats, "dtype": "bfloat16", "concepts": CONCEPTS,
              "rows": table, "note": "same-round ratios; absolute times depend on the machine's load"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
