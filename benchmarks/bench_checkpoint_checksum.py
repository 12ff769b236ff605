"""What verifying a checkpoint's SHA-256 costs: ``HMM.load`` of a shipped HMM re-saved by this
library (``config.json`` records the checksum of each tensor file) against the same folder with
the record removed (a checkpoint saved before checksums), in the dtype and emission format it
ships in, best of ``--repeat`` loads each, in one
process; also the time of one ``HMM.save`` (fsync and the crash-safe publish included) and of the
SHA-256 alone, as ratios against the load without checksum (absolute times on a loaded machine
say little).

    nice -n 10 python -m benchmarks.bench_checkpoint_checksum --hmm commongen-adapted \
        --out benchmarks/results/bench_checkpoint_checksum.json
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hmm", nargs="+", default=["commongen-adapted"],
                        help=f"embedded HMM names ({', '.join(EMBEDDED_HMMS)}) or folders")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(Path(embedded_hmm_path(name)) if name in EMBEDDED_HMMS else Path(name),
                    args.repeat) for name in args.hmm]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
