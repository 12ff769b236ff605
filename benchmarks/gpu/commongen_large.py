"""The main job with the HMM distilled at scale vs the embedded one: ``experiments.commongen`` on
the same items with the same seeds and the same LM, once per HMM, so the rows differ only by the
HMM (its size and training data). Does a large HMM fix short, telegraphic Ctrl-G outputs? The
table answers with BLEU-4, ROUGE-L, CIDEr, METEOR, success and mean output words per method
(``ctrlg.tasks.commongen.pipeline.report``), for logical masking (which uses no HMM: the two runs must
agree on it exactly, a check that the comparison is paired) and the Ctrl-G methods.

At ``--size full``: the embedded SmolLM2-135M-Instruct, dev items 0–199, K = 2, methods logical,
ctrlg_w075 (filtering prior, w = 0.75) and ctrlg (the recommendation: prior head, w = 0.75; both
HMMs need a head, which ``experiments.distill`` trains by default); the large HMM is the checkpoint that the
``distill_at_scale`` section writes under the work folder (run that section first, or pass
``--large-hmm``). The experiment runs where ``experiments.commongen`` runs (CPU). At ``--size
tiny``: a 1-layer random Llama over SmolLM2's vocabulary and two random HMMs without prior heads
(h = 4 as the "embedded" one, h = 8 as the "large" one) on two hand-made items, max 10 new tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.gpu.fixtures import llama_config, random_llama

__all__ = ["SIZES", "run", "MARKDOWN_COLUMNS"]

ROOT = Path(__file__).resolve().parents[2]

SIZES = {
    "tiny": dict(limit=2, max_new_tokens=10, num_samples=2, methods=["logical", "ctrlg_w075"],
                 hidden_sizes={"embedded": 4, "large": 8}),
    "full": dict(limit=200, max_new_tokens=32, num_samples=2,
                 methods=["logical", "ctrlg_w075", "ctrlg"]),
}

MARKDOWN_COLUMNS = [
    ("hmm", "HMM", "{}"), ("method", "method", "{}"), ("bleu4", "BLEU-4", "{:.2f}"),
    ("rouge_l", "ROUGE-L", "{:.2f}"), ("cider", "CIDEr", "{:.2f}"), ("meteor", "METEOR", "{}"),
    ("success", "success %", "{:.1f}"), ("words", "words", "{:.1f}"),
]

TINY_ITEMS = [{"concept_set": "dog_N#ball_N", "scene": ["The dog runs after the ball."]},
              {"concept_set": "sun_N#sky_N", "scene": ["The sun is high in the sky."]}]


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return compose(config_name="commongen", overrides=overrides)


def _tiny_fixtures(out_dir: Path, seed: int) -> tuple[dict, list[str]]:
    """(HMM name → checkpoint folder, extra overrides): a tiny LM over SmolLM2's vocabulary, two
    random HMMs, and the hand-made items."""
    from ctrlg import HMM
    from ctrlg.lm.models import load_tokenizer

    tokenizer = load_tokenizer()
    lm_dir = out_dir / "tiny_lm_smollm2_vocab"
    if not (lm_dir / "config.json").is_file():
        config = llama_config(len(tokenizer), max_position_embeddings=1024,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        random_llama(config, seed=seed).save_pretrained(lm_dir)
        tokenizer.save_pretrained(lm_dir)
    generator = torch.Generator().manual_seed(seed)
    normalise = lambda t: t / t.sum(-1, keepdim=True)  # noqa: E731
    paths = {}
    for name, h in SIZES["tiny"]["hidden_sizes"].items():
        paths[name] = out_dir / f"tiny_hmm_{name}_h{h}"
        HMM.from_params(normalise(torch.rand(h, generator=generator)),
                        normalise(torch.rand(h, h, generator=generator)),
                        normalise(torch.rand(h, len(tokenizer), generator=generator))).save(paths[name])
    items = out_dir / "tiny_items.jsonl"
    items.write_text("".join(json.dumps(item) + "\n" for item in TINY_ITEMS))
    return paths, [f"model.name={lm_dir}", f"data.path={items}", "metrics.meteor=false",
                   "bootstrap.resamples=0", "constraint.min_words=1"]


def run(size: str, device: torch.device, *, seed: int = 0, peak=None, out_dir: str | Path | None = None,
        large_hmm: str | Path | None = None, distill_dir: str | Path | None = None, **_) -> dict:
    """One ``experiments.commongen`` run per HMM (module docstring); rows per HMM × method."""
    from experiments import commongen

    p = SIZES[size]
    out_dir = Path(out_dir if out_dir is not None else "outputs/gpu_commongen")
    out_dir.mkdir(parents=True, exist_ok=True)
    if size == "tiny":
        paths, extra = _tiny_fixtures(out_dir, seed)
    else:
        if large_hmm is None:
            distill_dir = Path(distill_dir if distill_dir is not None else out_dir.parent / "distill")
            found = sorted(distill_dir.glob("h*_N*_seed*/hmm"))
            if not found:
                raise FileNotFoundError(
                    f"no distilled HMM under {distill_dir}: run the distill_at_scale section "
                    "first (same --work-dir) or pass --large-hmm")
            large_hmm = found[-1]
        paths, extra = {"embedded": None, "large": Path(large_hmm)}, []
    # the instruct pipeline: both HMMs were distilled from SmolLM2-135M-Instruct on instructions
    overrides = ["pipeline=instruct", f"seed={seed}", f"data.limit={p['limit']}", f"methods=[{','.join(p['methods'])}]",
                 f"generation.num_samples={p['num_samples']}",
                 f"generation.max_new_tokens={p['max_new_tokens']}", *extra]
    rows, tables = [], {}
    for name, path in paths.items():
        hmm_override = [f"hmm.path={path}"] if path is not None else []
        tables[name] = commongen.run(_compose(overrides + hmm_override), out_dir / f"commongen_{name}")
        for method in p["methods"]:
            metrics = tables[name][method]
            rows.append({"hmm": f"{name} ({path or 'ctrlg.hmm.load_default_hmm()'})", "method": method,
                         **{key: metrics.get(key) for key, _, _ in MARKDOWN_COLUMNS[2:]}})
    quality = lambda row: {k: v for k, v in row.items() if k != "seconds"}  # noqa: E731
    paired = quality(tables["embedded"]["logical"]) == quality(tables["large"]["logical"])
    return {"description": "experiments.commongen with the large HMM vs the embedded one "
                           "(same items, seeds and LM)",
            "overrides": overrides, "logical_rows_identical": paired, "rows": rows, "skipped": []}
