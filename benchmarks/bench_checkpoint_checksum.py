"""What verifying a checkpoint's SHA-256 costs: ``HMM.load`` of a shipped HMM re-saved by this
library (``config.json`` records the checksum of each tensor file) against the same folder with
the record removed (a checkpoint saved before checksums), in the dtype and emission format it
ships in, best of ``--repeat`` loads each, in one
process; also the time of one ``HMM.save`` (fsync and the crash-safe publish included) and of the
SHA-256 alone, as ratios against the load without checksum (absolute times on a loaded machine
say little).

    nice -n 10 python -m benchmarks.bench_checkpoint_checksum --hmm commongen-adapted \
        --out benchmarks/results/bench_checkpoint_checksum.json

``--adapter NAME``: the same for a shipped LoRA adapter (``ctrlg.lm.adapters``): ``merge_adapter``
into the embedded base LM (its copy made outside the timing) of a copy of the shipped folder
whose ``ctrlg_adapter.json`` records ``checksums`` against the folder as shipped (none recorded),
and the SHA-256 of the recorded files alone, as ratios against the merge without checksums.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open

from ctrlg import HMM
from ctrlg.checkpoint import file_sha256
from ctrlg.hmm import EMBEDDED_HMMS, embedded_hmm_path

WEIGHTS = "model.safetensors"


def _best(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _stored_dtype(source: Path) -> torch.dtype:
    """The float dtype the source checkpoint stores its transition matrix in (the re-save keeps
    it, so the file is the shipped size)."""
    with safe_open(str(source / WEIGHTS), "pt") as handle:
        return handle.get_slice("transition").get_dtype() == "BF16" and torch.bfloat16 or torch.float32


def measure(source: Path, repeat: int = 3) -> dict:
    config = json.loads((source / "config.json").read_text())
    hmm = HMM.load(source)
    with tempfile.TemporaryDirectory() as tmp:
        checked, legacy = Path(tmp) / "checked", Path(tmp) / "legacy"
        start = time.perf_counter()
        hmm.save(checked, dtype=_stored_dtype(source),
                 emission_quantization=config.get("emission_quantization"))
        save_s = time.perf_counter() - start
        shutil.copytree(checked, legacy)
        legacy_config = json.loads((legacy / "config.json").read_text())
        del legacy_config["checksums"]
        (legacy / "config.json").write_text(json.dumps(legacy_config))
        without, with_sum, sha = [], [], []
        for _ in range(repeat):                 # interleaved: the machine's load drifts
            without.append(_best(lambda: HMM.load(legacy), 1))
            with_sum.append(_best(lambda: HMM.load(checked), 1))
            sha.append(_best(lambda: file_sha256(checked / WEIGHTS), 1))
        without, with_sum, sha = min(without), min(with_sum), min(sha)
        size = (checked / WEIGHTS).stat().st_size
    return {"hmm": source.name, "emission_quantization": config.get("emission_quantization"),
            "weights_mib": round(size / 2 ** 20, 1), "repeat": repeat,
            "load_with_checksum_over_without": round(with_sum / without, 3),
            "sha256_over_load": round(sha / without, 3),
            "save_over_load": round(save_s / without, 2)}


def measure_adapter(name: str, repeat: int = 3) -> dict:
    import copy

    from ctrlg.lm import adapters
    from ctrlg.lm.models import load_model

    source = adapters.resolve_adapter(name)
    base = load_model()
    with tempfile.TemporaryDirectory() as tmp:
        checked = Path(tmp) / source.name
        shutil.copytree(source, checked)
        info = json.loads((checked / adapters.META_FILE).read_text())
        info["checksums"] = adapters.adapter_checksums(checked)
        (checked / adapters.META_FILE).write_text(json.dumps(info, indent=2))

        def merge(folder):
            model = copy.deepcopy(base)          # merging changes the model: a fresh copy each
            start = time.perf_counter()
            adapters.merge_adapter(model, folder)
            return time.perf_counter() - start

        without, with_sum, sha = [], [], []
        for _ in range(repeat):                 # interleaved: the machine's load drifts
            without.append(merge(source))
            with_sum.append(merge(checked))
            sha.append(_best(lambda: adapters.adapter_checksums(checked), 1))
        without, with_sum, sha = min(without), min(with_sum), min(sha)
        size = (checked / adapters.WEIGHTS_FILE).stat().st_size
    return {"adapter": source.name, "weights_mib": round(size / 2 ** 20, 1), "repeat": repeat,
            "merge_with_checksum_over_without": round(with_sum / without, 3),
            "sha256_over_merge": round(sha / without, 4)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hmm", nargs="*", default=["commongen-adapted"],
                        help=f"embedded HMM names ({', '.join(EMBEDDED_HMMS)}) or folders")
    parser.add_argument("--adapter", nargs="*", default=[],
                        help="shipped adapter names (ctrlg.lm.adapters.EMBEDDED_ADAPTERS) or folders")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(Path(embedded_hmm_path(name)) if name in EMBEDDED_HMMS else Path(name),
                    args.repeat) for name in args.hmm]
    rows += [measure_adapter(name, args.repeat) for name in args.adapter]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
