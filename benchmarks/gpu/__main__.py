"""``python -m benchmarks.gpu``: the GPU benchmark harness of ctrlg (run from the repository root).

    python -m benchmarks.gpu --device cuda --size full          # every table, on a GPU
    python -m benchmarks.gpu --device cpu --size tiny           # seconds; what the test suite runs
    python -m benchmarks.gpu --device cuda --sections backward_table em_estep

Sections (one module each): ``em_estep``, ``backward_table``, ``guidance_overhead``,
``distill_at_scale``, ``commongen_large`` (the main job with the distilled HMM vs the embedded
one; after ``distill_at_scale``). Results: ``<out>/gpu_<device-slug>.json`` and ``.md`` (see ``report.py``);
a section that raises is recorded with its error and the others still run (exit status 1).
On CPU the Triton kernels run under the interpreter: ``TRITON_INTERPRET=1`` is set here before
anything imports Triton (only for ``--device cpu``, and only if the variable is unset).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path

SECTIONS = ("em_estep", "backward_table", "guidance_overhead", "distill_at_scale", "commongen_large")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--out", default="benchmarks/results", help="folder for the JSON and markdown")
    parser.add_argument("--work-dir", default="outputs/gpu_benchmark",
                        help="scratch folder (distillation samples and checkpoint; git-ignored)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-sizes", type=int, nargs="+", default=None,
                        help="override the hidden sizes of the E-step / backward-table / guidance sections")
    parser.add_argument("--distill-hidden", type=int, default=None, help="h of the distilled HMM")
    parser.add_argument("--distill-sequences", type=int, default=None, help="N training samples")
    parser.add_argument("--large-hmm", default=None,
                        help="commongen_large: the large HMM's checkpoint folder (default: the one "
                             "distill_at_scale wrote under --work-dir)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads for CPU work (default: torch's choice)")
    parser.add_argument("--no-merge", action="store_true",
                        help="overwrite the result files instead of keeping sections not run now")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cpu"):
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import importlib

    import torch
    import transformers

    from benchmarks.gpu.peaks import PEAK_SOURCE, peak_for
    from benchmarks.gpu.report import write_results
    from benchmarks.gpu.timing import device_name

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda, but torch sees no CUDA device; use --device cpu", file=sys.stderr)
        return 2
    name = device_name(device)
    peak = peak_for(name) if device.type == "cuda" else None
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    command = "python -m benchmarks.gpu " + " ".join(sys.argv[1:] if argv is None else argv)
    results = {
        "meta": {"device": str(device), "device_name": name, "size": args.size, "seed": args.seed,
                 "peak": peak.as_dict() if peak else None, "peak_source": PEAK_SOURCE,
                 "torch": torch.__version__, "triton": triton_version,
                 "transformers": transformers.__version__, "python": sys.version.split()[0],
                 "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
                 "started_utc": started, "command": command},
        "sections": {},
    }
    columns, failed = {}, False
    for section in SECTIONS:
        module = importlib.import_module(f"benchmarks.gpu.{section}")
        columns[section] = module.MARKDOWN_COLUMNS
        if section not in args.sections:
            continue
        kwargs = {"seed": args.seed, "peak": peak}
        if section == "distill_at_scale":
            kwargs.update(out_dir=Path(args.work_dir) / "distill", hidden_size=args.distill_hidden,
                          num_sequences=args.distill_sequences)
        elif section == "commongen_large":
            kwargs.update(out_dir=Path(args.work_dir) / "commongen", large_hmm=args.large_hmm,
                          distill_dir=Path(args.work_dir) / "distill")
        else:
            kwargs["hidden_sizes"] = args.hidden_sizes
        print(f"[{section}] running at size {args.size} on {name} ...", flush=True)
        try:
            out = module.run(args.size, device, **kwargs)
        except Exception as err:  # record it and go on with the other sections
            traceback.print_exc()
            out = {"error": f"{type(err).__name__}: {err}", "rows": [], "skipped": []}
            failed = True
        out["measured_utc"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        out["command"] = command
        results["sections"][section] = out
        if device.type == "cuda":
            torch.cuda.empty_cache()
    json_path, md_path = write_results(results, columns, args.out, merge=not args.no_merge)
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
