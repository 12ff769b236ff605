"""Held-out log-likelihood and checkpoint size of an HMM under each storage format.

    python -m benchmarks.bench_hmm_storage --hmm commongen-adapted --formats log8 topk8-1024 topk8-4096
    python -m benchmarks.bench_hmm_storage --hmm outputs/.../hmm --samples outputs/.../samples/heldout
    python -m benchmarks.bench_hmm_storage --hmm commongen-human-h512 --formats topk8-4096 topk8-4096@3 \
        --support-samples outputs/distill_samples/<run>/train --samples outputs/distill_samples/<run>/heldout

For each format the HMM is saved to a temporary folder (the file size is what ships), loaded
back, and scored by the forward algorithm on (a) CommonGen dev references — the first reference of
the first ``--refs`` items, as the adapted LM writes them (" " + sentence + EOS), EOS-padding
masked — and (b) with ``--samples``, held-out LM samples (EOS-padded to their length, as the EM
trained on them). Figures are mean log-likelihood per token in nats; "as loaded" is the HMM as it
was read (its own format). ``topk8-K@m`` keeps each state's K tokens among those the training
samples (``--support-samples``) hold ≥ m times (:func:`ctrlg.hmm.quantize.support_from_tokens`).
"Guide product columns" is how many columns of B the guide's per-token product multiplies
(:mod:`ctrlg.guide.factored_emission`). Writes a markdown table to stdout and, with ``--out``,
JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from ctrlg.guide.factored_emission import rank_one_tail
from ctrlg.hmm import EMBEDDED_HMMS, embedded_hmm_path
from ctrlg.hmm.model import HMM
from ctrlg.hmm.quantize import support_from_tokens


def reference_batch(tokenizer, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [n, w], mask [n, w]) of the first reference of the first ``limit`` dev items."""
    from ctrlg.data import load_commongen
    from ctrlg.data.commongen_prompts import target_text

    references = [ex.references[0] for ex in load_commongen(limit=limit)]
    rows = [tokenizer(target_text(s, tokenizer), add_special_tokens=False)["input_ids"] for s in references]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.eos_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[i < len(r) for i in range(width)] for r in rows])
    return ids, mask


def per_token(hmm: HMM, ids: torch.Tensor, mask: torch.Tensor | None, batch: int = 512) -> float:
    total, count = 0.0, 0
    for start in range(0, ids.shape[0], batch):
        part = ids[start:start + batch].to(hmm.emission.device)
        m = None if mask is None else mask[start:start + batch].to(hmm.emission.device)
        total += float(hmm.log_prob(part, mask=m).double().sum())
        count += int(part.numel() if m is None else m.sum())
    return total / max(count, 1)


def storage_round_trip(hmm: HMM, fmt: str, folder: Path,
                       support_tokens: torch.Tensor | None = None) -> tuple[HMM, int]:
    """The HMM after saving in ``fmt`` (float32 / bfloat16 / an emission scheme; ``topk8-K@m``:
    kept among the tokens ``support_tokens`` holds ≥ m times) and loading."""
    scheme, _, min_count = fmt.partition("@")
    support = None
    if min_count:
        if support_tokens is None:
            raise SystemExit(f"format {fmt!r} needs --support-samples (the training samples)")
        eos = hmm.config.get("eos_token_id")
        support = support_from_tokens(support_tokens, hmm.vocab_size, int(min_count),
                                      always=() if eos is None else (int(eos),))
    if scheme in ("float32", "bfloat16"):
        hmm.save(folder, dtype=getattr(torch, scheme))
    else:
        hmm.save(folder, dtype=torch.bfloat16, emission_quantization=scheme, emission_support=support)
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return HMM.load(folder), size


def guide_support(hmm: HMM) -> int:
    """Columns of the guide's dense product for ``hmm``: V, or the support of a rank-1 tail."""
    tail = rank_one_tail(hmm.emission.float().T.contiguous())
    return hmm.vocab_size if tail is None else len(tail.support)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hmm", default="commongen-human-h512", help="embedded name or folder")
    parser.add_argument("--formats", nargs="*", default=["log8", "topk8-1024", "topk8-4096"])
    parser.add_argument("--refs", type=int, default=500)
    parser.add_argument("--samples", default=None, help="a folder of held-out sample chunks")
    parser.add_argument("--max-samples", type=int, default=4096)
    parser.add_argument("--support-samples", default=None,
                        help="a folder of training sample chunks: the counts behind topk8-K@m formats")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from ctrlg.lm import models
    from ctrlg.hmm.sampling import load_chunks

    folder = embedded_hmm_path(args.hmm) if args.hmm in EMBEDDED_HMMS else Path(args.hmm)
    base = HMM.load(folder)
    tokenizer = models.load_tokenizer(None)
    refs = reference_batch(tokenizer, args.refs)
    samples = None
    if args.samples:
        samples = load_chunks(args.samples, ("tokens",))["tokens"][:args.max_samples]
    support_tokens = load_chunks(args.support_samples, ("tokens",))["tokens"] if args.support_samples else None
    rows = []

    def score(name: str, hmm: HMM, size: int | None) -> None:
        hmm = hmm.to(args.device)
        row = {"format": name, "bytes": size, "dev_refs_ll": per_token(hmm, *refs),
               "guide_columns": guide_support(hmm)}
        if samples is not None:
            row["heldout_samples_ll"] = per_token(hmm, samples, None)
        rows.append(row)

    shipped = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    score(f"as loaded ({base.config.get('emission_quantization') or base.config.get('dtype')})", base, shipped)
    with tempfile.TemporaryDirectory() as tmp:
        for i, fmt in enumerate(args.formats):
            hmm, size = storage_round_trip(base, fmt, Path(tmp) / str(i), support_tokens)
            score(fmt, hmm, size)
    print(f"HMM {args.hmm}: h = {base.hidden_size}, V = {base.vocab_size}; log-likelihood per token (nats)")
    head = "| format | size (MB) | guide product columns | dev references |" + \
        (" held-out samples |" if samples is not None else "")
    print(head)
    print("|---|---|---|---|" + ("---|" if samples is not None else ""))
    for row in rows:
        line = f"| {row['format']} | {row['bytes'] / 1e6:.1f} | {row['guide_columns']:,} | {row['dev_refs_ll']:.4f} |"
        if samples is not None:
            line += f" {row['heldout_samples_ll']:.4f} |"
        print(line)
    result = {"hmm": str(args.hmm), "hidden_size": base.hidden_size, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
