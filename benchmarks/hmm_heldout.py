"""Held-out log-likelihood per token of several HMMs on the same LM samples: which HMM models a
task's text best (e.g. the editing HMM against the story HMM on continuations of held-out
prompts).

    python -m benchmarks.hmm_heldout SAMPLES_DIR stories-continue-h512 stories-h512 [FOLDER ...]

``SAMPLES_DIR`` holds sample chunks written by the distillation's sampler (its ``heldout``
folder: ``experiments.distill``'s ``sampling.dir``/heldout); each HMM is an embedded name or a
checkpoint folder. Prints ``{"sequences", "lm": the sampling LM's own log-likelihood per token,
name: the HMM's}``, EOS padding included (:func:`ctrlg.hmm.em.heldout_ll_per_token`, one forward
pass, O(N·L·h²) per HMM).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path)
    parser.add_argument("hmms", nargs="+", help="embedded HMM names or checkpoint folders")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    from ctrlg.hmm import EMBEDDED_HMMS, HMM, embedded_hmm_path
    from ctrlg.hmm.em import heldout_ll_per_token
    from ctrlg.hmm.sampling import load_chunks

    torch.set_num_threads(args.threads)
    data = load_chunks(args.samples, ("tokens", "logprob"))
    tokens = data["tokens"]
    out = {"sequences": int(tokens.shape[0]),
           "lm": float(data["logprob"].double().sum() / tokens.numel())}
    for name in args.hmms:
        path = embedded_hmm_path(name) if name in EMBEDDED_HMMS else Path(name)
        out[name] = heldout_ll_per_token(HMM.load(path), tokens)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
