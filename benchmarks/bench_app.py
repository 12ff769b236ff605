"""Benchmark: seconds per editor request on the embedded SmolLM2-135M + HMM, over HTTP, and the
screenshot in docs/app.md.

Serves the real app (``ctrlg.app.create_app``) on a free loopback port and sends each workload
``--requests`` times (seeds 0, 1, ...) to ``POST /api/generate`` on CoAuthor example documents:

* ``insert``   — "pig": insert before "And the wolf was like..." with keyphrase *brick*, banned
  *house*, 4–15 words, no line break, 4 candidates, 32 new tokens (Ctrl-G) — the page's defaults;
* ``insert-logical`` — the same with logical masking;
* ``continue`` — "screen": continue "In my opinion," with keyphrase *balance*, 5–20 words.

Reports the median / min of the server-side seconds and writes ``benchmarks/results/bench_app.json``.
The first request of a constraint also builds its DFA (memoised afterwards).
``--screenshot PATH`` then opens the page in headless Chromium, runs the insertion through the UI
and saves a PNG (see docs/app.md).

    python -m benchmarks.bench_app --threads 1 --requests 3 --screenshot docs/app.png
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3, help="requests per workload")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--screenshot", type=Path, default=None, help="save a PNG of the page here")
    args = parser.parse_args()

    import torch

    from ctrlg.app import create_app
    from ctrlg.app.examples import load_examples
    from ctrlg.app.server import background_server
    from ctrlg.hmm import load_default_hmm
    from ctrlg.lm.models import load_model, load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, tokenizer = load_model(), load_tokenizer()
    hmm = load_default_hmm(tokenizer=tokenizer)
    load_seconds = time.perf_counter() - start
    examples = {e["code"]: e["text"] for e in load_examples()}
    app = create_app(model, tokenizer, hmm, model_name="SmolLM2-135M-Instruct (embedded)")
    rows = []
    with background_server(app) as base:
        for name, body in workloads(examples).items():
            seconds, samples = [], None
            for seed in range(args.requests):
                result = post(base, {**body, "seed": seed})
                seconds.append(result["seconds"])
                samples = samples or [c["text"] for c in result["candidates"]]
            rows.append({"workload": name, "requests": args.requests,
                         "median_s": statistics.median(seconds), "min_s": min(seconds),
                         "seconds": seconds, "example_candidates": samples})
            print(f"{name:15s} median {rows[-1]['median_s']:6.2f} s   min {rows[-1]['min_s']:6.2f} s"
                  f"   ({args.requests} requests)   e.g. {samples[0]!r}" if samples else "")
        if args.screenshot:
            screenshot(base, args.screenshot)
            print(f"screenshot → {args.screenshot}")
    RESULTS.mkdir(exist_ok=True)
    out = {"threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
           "load_seconds": load_seconds, "rows": rows}
    (RESULTS / "bench_app.json").write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    print(f"→ {RESULTS / 'bench_app.json'}")


if __name__ == "__main__":
    main()
