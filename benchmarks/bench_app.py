"""Benchmark: seconds per editor request with the editor's defaults (``python -m ctrlg.app``: the
embedded SmolLM2-135M-Instruct + the ``stories-continue`` adapter and its HMM), over HTTP, and the
screenshot in docs/app.md.

Serves the real app (``ctrlg.app.create_app``) on a free loopback port and sends each workload
``--requests`` times (seeds 0, 1, ...) to ``POST /api/generate`` on CoAuthor example documents:

* ``insert``   — "pig": insert before "And the wolf was like..." with keyphrase *brick*, banned
  *house*, 4–15 words, no line break, 4 candidates, 32 new tokens (Ctrl-G) — the page's defaults;
* ``insert-logical`` — the same with logical masking;
* ``continue`` — "screen": continue "In my opinion," with keyphrase *balance*, 5–20 words.

Reports the median / min of the server-side seconds and writes ``benchmarks/results/bench_app.json``.
A first request per workload (seed 99, not counted) builds the constraint's DFA, which the editor
memoises, so the timed requests measure decoding. The editor also keeps the encoding of the last
prompts (:class:`ctrlg.lm.shared_context.ContextCache`), so those requests — the writer asking
again at the same place — read it; ``cold_median_s`` times the same requests with it emptied
before each (the first request at a new place).
``--reference`` also sends every request with the prompt repeated per candidate, as before
:mod:`ctrlg.lm.shared_context` (transformers encodes one copy of the prompt per returned sequence,
and the rerank pads prompt + candidate per row), in the same process, and reports the ratio.
``--screenshot PATH`` then opens the page in headless Chromium, runs the insertion through the UI
and saves a PNG (see docs/app.md). ``--int8-weights`` serves the LM with int8 weights (the
editor's option of the same name, :mod:`ctrlg.lm.int8_weights`); ``--out`` writes elsewhere.

    python -m benchmarks.bench_app --threads 2 --requests 3 --reference --screenshot docs/app.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from unittest import mock

RESULTS = Path(__file__).resolve().parent / "results"
WOLF = " And the wolf was like"


def workloads(examples: dict[str, str]) -> dict[str, dict]:
    pig = examples["pig"]
    cut = pig.index(WOLF)
    insert = {"prefix": pig[:cut], "suffix": pig[cut:], "keyphrases": ["brick"],
              "banned": ["house"], "min_words": 4, "max_words": 15, "num_candidates": 4,
              "max_new_tokens": 32, "mode": "ctrlg", "allow_newlines": False}
    return {
        "insert": insert,
        "insert-logical": {**insert, "mode": "logical"},
        "continue": {"prefix": examples["screen"], "suffix": "", "keyphrases": ["balance"],
                     "min_words": 5, "max_words": 20, "num_candidates": 4, "max_new_tokens": 32,
                     "mode": "ctrlg", "allow_newlines": False},
    }


def post(base: str, body: dict) -> dict:
    request = urllib.request.Request(base + "/api/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def screenshot(base: str, path: Path, width: int = 1400, height: int = 1150) -> None:
    """The insertion workload through the page; the first candidate shown in place."""
    from selenium.webdriver.support.ui import WebDriverWait

    from ctrlg.app.browser import headless_chromium

    with tempfile.TemporaryDirectory(prefix="ctrlg-chromium-") as profile:
        driver = headless_chromium(profile, width, height)
        try:
            driver.get(base + "/")
            WebDriverWait(driver, 30).until(
                lambda d: len(d.find_elements("css selector", "#examples option")) > 1)
            driver.execute_script("""
                const select = document.getElementById('examples');
                select.value = [...select.options].find(o => o.textContent.endsWith('pig')).value;
                select.dispatchEvent(new Event('change'));
                const doc = document.getElementById('document');
                const at = doc.value.indexOf(arguments[0]);
                doc.setSelectionRange(at, at);
                doc.dispatchEvent(new Event('keyup'));""", WOLF)
            for element_id, text in (("keyphrases", "brick"), ("banned", "house"),
                                     ("min-words", "4"), ("max-words", "15")):
                field = driver.find_element("id", element_id)
                field.clear()
                field.send_keys(text)
            driver.find_element("id", "generate").click()
            WebDriverWait(driver, 600).until(
                lambda d: d.find_elements("css selector", "#candidates .candidate"))
            time.sleep(0.3)
            path.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(path))
        finally:
            driver.quit()


def _padded_log_likelihood(model, prompt_ids, candidates, batch_size: int = 16, **_) -> list[float]:
    """The reference rerank: each row holds prompt + candidate, right-padded, one forward."""
    import torch

    scores = []
    for lo in range(0, len(candidates), batch_size):
        chunk = [list(map(int, c)) for c in candidates[lo:lo + batch_size]]
        width = len(prompt_ids) + max((len(c) for c in chunk), default=0)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, c in enumerate(chunk):
            ids[i, :len(prompt_ids) + len(c)] = torch.tensor(list(prompt_ids) + c)
            mask[i, :len(prompt_ids) + len(c)] = 1
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        n = len(prompt_ids)
        scores += [float(logp[i, n - 1:n - 1 + len(c)].sum()) for i, c in enumerate(chunk)]
    return scores


@contextlib.contextmanager
def repeated_prompts():
    """The reference path: no shared prompt cache anywhere in the request."""
    from ctrlg.lm.shared_context import SharedContext

    with mock.patch.object(SharedContext, "reusable", property(lambda self: False)), \
            mock.patch("ctrlg.app.service.lm_log_likelihood", _padded_log_likelihood):
        yield


def run_workload(base: str, body: dict, requests: int, before=None) -> tuple[list[float], list[str] | None]:
    seconds, samples = [], None
    for seed in range(requests):
        if before is not None:
            before()
        result = post(base, {**body, "seed": seed})
        seconds.append(result["seconds"])
        samples = samples or [c["text"] for c in result["candidates"]]
    return seconds, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3, help="requests per workload")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--screenshot", type=Path, default=None, help="save a PNG of the page here")
    parser.add_argument("--adapter", default=None, help="the editor's --adapter (default: its default)")
    parser.add_argument("--hmm", default=None, help="the editor's --hmm (default: its default)")
    parser.add_argument("--weights", default=None, help="the editor's --weights (default: its default)")
    parser.add_argument("--int8-weights", dest="weights", action="store_const", const="int8",
                        help="the same as --weights int8")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/bench_app.json")
    parser.add_argument("--reference", action="store_true",
                        help="also time each workload with the prompt repeated per candidate")
    args = parser.parse_args()

    import torch

    from ctrlg.app import create_app
    from ctrlg.app.compute import ComputeThread
    from ctrlg.app.__main__ import DEFAULT_ADAPTER, DEFAULT_HMM, DEFAULT_WEIGHTS, load_editor
    from ctrlg.app.examples import load_examples
    from ctrlg.app.server import background_server

    compute = ComputeThread(args.threads)   # as the editor: one thread loads and decodes
    start = time.perf_counter()
    model, tokenizer, hmm, header, description = compute.run(
        load_editor, None, args.adapter or DEFAULT_ADAPTER, args.hmm or DEFAULT_HMM,
        args.weights or DEFAULT_WEIGHTS)
    load_seconds = time.perf_counter() - start
    examples = {e["code"]: e["text"] for e in load_examples()}
    app = create_app(model, tokenizer, hmm, model_name=description, prompt_header=header,
                     compute=compute)
    rows = []
    with background_server(app) as base:
        for name, body in workloads(examples).items():
            run_workload(base, {**body, "seed": 99}, 1)      # builds and memoises the DFA
            seconds, samples = run_workload(base, body, args.requests)
            cold, _ = run_workload(base, body, args.requests, before=app.state.service.forget_prompts)
            row = {"workload": name, "requests": args.requests,
                   "median_s": statistics.median(seconds), "min_s": min(seconds),
                   "seconds": seconds, "cold_median_s": statistics.median(cold),
                   "cold_seconds": cold, "example_candidates": samples}
            if args.reference:
                with repeated_prompts():
                    before, _ = run_workload(base, body, args.requests)
                row.update(reference_median_s=statistics.median(before), reference_seconds=before,
                           speedup=statistics.median(before) / statistics.median(seconds))
            rows.append(row)
            print(f"{name:15s} median {row['median_s']:6.2f} s   min {row['min_s']:6.2f} s"
                  f"   cold {row['cold_median_s']:6.2f} s"
                  + (f"   reference {row['reference_median_s']:6.2f} s (x{row['speedup']:.2f})"
                     if args.reference else "")
                  + (f"   e.g. {samples[0]!r}" if samples else ""))
        if args.screenshot:
            screenshot(base, args.screenshot)
            print(f"screenshot → {args.screenshot}")
    out_path = args.out or RESULTS / "bench_app.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out = {"threads": compute.run(torch.get_num_threads), "machine": platform.processor() or platform.machine(),
           "editor": description, "load_seconds": load_seconds, "rows": rows}
    out_path.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    print(f"→ {out_path}")


if __name__ == "__main__":
    main()
