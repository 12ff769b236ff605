"""What the editor suggests with its defaults on docs/app.md's two examples, in both modes:
``benchmarks/results/editor_suggestions.json``.

* ``issue_example`` — "Last summer we drove to the coast." ▮ " We stayed until sunset.", keyphrase
  *lighthouse*, banned *beach*, 6–20 words;
* ``pig`` — CoAuthor's "pig" prompt, cursor before " And the wolf was like", keyphrase *brick*,
  banned *house*, 4–15 words.

4 candidates of at most 32 tokens, seed 0, no line breaks, through ``EditorService.generate``
(the server's code path without HTTP); the seconds are one request's, on whatever else the
machine runs (``benchmarks.bench_app`` times the editor).

    python -m benchmarks.editor_suggestions [--hmm NAME] [--weights FORMAT] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.bench_app import RESULTS, WOLF


def requests(examples: dict[str, str]) -> dict[str, dict]:
    pig = examples["pig"]
    cut = pig.index(WOLF)
    return {
        "issue_example": dict(prefix="Last summer we drove to the coast.",
                              suffix=" We stayed until sunset.", keyphrases=["lighthouse"],
                              banned=["beach"], min_words=6, max_words=20),
        "pig": dict(prefix=pig[:cut], suffix=pig[cut:], keyphrases=["brick"], banned=["house"],
                    min_words=4, max_words=15),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hmm", default=None, help="the editor's --hmm (default: its default)")
    parser.add_argument("--weights", default=None, help="the editor's --weights (default: its default)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=RESULTS / "editor_suggestions.json")
    args = parser.parse_args(argv)

    from ctrlg.app.__main__ import DEFAULT_ADAPTER, DEFAULT_HMM, DEFAULT_WEIGHTS, load_editor
    from ctrlg.app.compute import ComputeThread
    from ctrlg.app.examples import load_examples
    from ctrlg.app.schemas import GenerateRequest
    from ctrlg.app.service import EditorService

    compute = ComputeThread(args.threads)   # as the editor: one thread loads and decodes
    model, tokenizer, hmm, header, description = compute.run(
        load_editor, None, DEFAULT_ADAPTER, args.hmm or DEFAULT_HMM, args.weights or DEFAULT_WEIGHTS)
    service = EditorService(model, tokenizer, hmm, prompt_header=header, compute=compute)
    examples = {e["code"]: e["text"] for e in load_examples()}
    out = {"editor": description}
    for name, body in requests(examples).items():
        for mode in ("ctrlg", "logical"):
            request = GenerateRequest(**body, mode=mode, num_candidates=4, max_new_tokens=32,
                                      seed=0, allow_newlines=False)
            start = time.perf_counter()
            result = service.generate(request, service.open_job(None, 32))
            out[f"{name}/{mode}"] = {"seconds": time.perf_counter() - start,
                                     "candidates": [c["text"] for c in result["candidates"]]}
            print(f"{name}/{mode}: " + json.dumps(out[f"{name}/{mode}"], ensure_ascii=False))
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"→ {args.out}")
    return out


if __name__ == "__main__":
    main()
