"""Fuzz campaign, storage side: damaged run records, two writers, kills inside a checkpoint save,
bit flips and bad quantised data (the decoding side is :mod:`benchmarks.fuzz_campaign`).

Each case draws, from its own seed, one of five kinds; each has an oracle of its own, written
without the library's readers:

* ``records`` — a CommonGen run's ``generations.jsonl`` (plain, or a gzip copy cut at a random
  byte) for a random selection of items, with random damage: a second record of an item, a
  record of an item outside the selection, an index of another type (``"1"``, ``1.0``, ``true``,
  ``[1]``, ``null``), a record without its fields (``{"index": 1}``), another item's concepts,
  an output without text, torn and non-JSON lines. The resume
  (:func:`ctrlg.tasks.commongen.pipeline.resume_records`) must return exactly the first
  well-formed record of each selected item among the complete lines the bytes hold, and a
  :class:`~ctrlg.tasks.records.RecordWriter` resuming in place must keep those and put every
  other line in the side file (none lost);
* ``two_writers`` — a writer appends to a run folder while a second writer (in this process or
  a forked one) starts on the same folder and writes too, in a random order: every record
  either writer was allowed to write must end up in the file or the side file, and a refused
  writer must be told who holds the folder (its pid);
* ``kill_publish`` — a random HMM (h ≤ 5, V ≤ 40; float32, bfloat16 or an 8-bit emission
  scheme; with or without a prior head) saved into a folder that holds an older checkpoint and
  the user's files; one or two saves in a row are SIGKILLed just before a random system call of
  the publish step (a forked child). The next load must give the old or the new parameters,
  the user's files must be intact, and a save after it must leave nothing beside the folder;
* ``bit_flip`` — one random bit of ``model.safetensors`` or ``prior_head.safetensors`` of a
  random HMM (4 ≤ h ≤ 16, 50 ≤ V ≤ 200, so most bits are tensor data) flipped: the load must be
  a CheckpointError;
* ``bad_quantized`` — one tensor of a ``log8`` / ``normq8`` / ``topk8-K`` checkpoint replaced by
  a random misfit (indices out of range or repeated, shapes, dtypes, NaN, signs; recorded with a
  matching checksum, a deliberate edit), or a bad ``emission_quantization`` in ``save()`` or in
  ``config.json``: a CheckpointError, or a load whose parameters are distributions.

Any other exception is a violation too. Run against an older library (``PYTHONPATH=<its tree>``)
the campaign measures that library: where the run resume it calls did not exist yet it calls
what ``experiments/commongen.py`` called then (``read_records(folder)``).

    nice -n 10 python -m benchmarks.fuzz_storage --cases 2000
    python -m benchmarks.fuzz_storage --cases 50 --seed 7 --out x.json --replay 12

Prints a summary (cases and violations per kind) and writes it to ``--out`` (default
``benchmarks/results/fuzz_storage.json``) with the first violations' seeds. The suite runs a
small campaign (tests/test_fuzz_storage.py).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import zlib
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ctrlg import HMM, checkpoint
from ctrlg.errors import CheckpointError, CtrlgError
from ctrlg.hmm.prior_head import PriorHead
from ctrlg.tasks import records as run_records

try:
    from ctrlg.tasks.commongen.pipeline import record_schema, resume_records
except ImportError:          # an older library: what experiments/commongen.py read (docstring)
    record_schema = resume_records = None

KINDS = ("records", "two_writers", "kill_publish", "bit_flip", "bad_quantized")
METHOD = "ctrlg"
SCHEMES = (None, None, "bf16", "log8", "normq8", "topk8")


def _scheme(rng, plain=0.5):
    """None (float32) with probability ``plain``, else one of the other storage formats."""
    return None if rng.random() < plain else SCHEMES[int(rng.integers(2, len(SCHEMES)))]


# ---------------------------------------------------------------------- records
def _record(index, concepts, text="a text"):
    return {"index": index, "concepts": concepts, "keyword_groups": [[c] for c in concepts],
            "references": [f"a reference of {index}"], METHOD: {"text": text}}


def _usable(record, items: dict) -> bool:
    """The oracle of a usable record: an int index of a selected item, that item's concepts,
    lists of references and keyword groups, a reason or a text output."""
    if not isinstance(record, dict) or type(record.get("index")) is not int:
        return False
    index = record["index"]
    if index not in items or record.get("concepts") != items[index]:
        return False
    if not isinstance(record.get("references"), list) or \
            not isinstance(record.get("keyword_groups"), list):
        return False
    if "skipped" in record:
        return isinstance(record["skipped"], str)
    output = record.get(METHOD)
    return isinstance(output, dict) and isinstance(output.get("text"), str)


def _damaged_line(rng, items: dict, indices: list[int]) -> str:
    index = int(rng.choice(indices))
    concepts = items[index]
    good = _record(index, concepts, f"another text {rng.integers(1000)}")
    choice = int(rng.integers(12))
    if choice == 0:
        return json.dumps(good)                                           # a second record
    if choice == 1:
        return json.dumps({**good, "index": int(max(items) + 1 + rng.integers(5))})
    if choice == 2:
        return json.dumps({**good, "index": -1})
    if choice == 3:
        return json.dumps({**good, "index": [str(index), float(index), True, [index], None][
            int(rng.integers(5))]})
    if choice == 4:
        return json.dumps({"index": index})
    if choice == 5:
        return json.dumps({**good, "concepts": concepts[::-1] + ["other"]})
    if choice == 6:
        return json.dumps({**good, METHOD: {"score": 1}})
    if choice == 7:
        return json.dumps({**good, "references": "one"})
    if choice == 8:
        return json.dumps(good)[:int(rng.integers(1, 20))]                # torn
    if choice == 9:
        return "[1, 2, 3]"
    if choice == 10:
        return json.dumps({**good, "skipped": 3})
    return "not json at all"


def _lines(data: bytes, gz: bool) -> list[str]:
    """The oracle's reading: every line the bytes hold (the last one perhaps cut short: it
    counts when it still parses), a gzip copy inflated as far as it goes."""
    if gz:
        try:
            data = zlib.decompressobj(wbits=31).decompress(data)
        except zlib.error:
            data = b""
    text = data.decode("utf-8", errors="replace")
    return text.split("\n")


def case_records(rng, folder: Path) -> str | None:
    count = int(rng.integers(1, 9))
    first = int(rng.integers(0, 3))
    items = {first + i: [f"c{first + i}", f"w{int(rng.integers(3))}"] for i in range(count)}
    indices = sorted(items)
    lines = []
    for index in indices:
        if rng.random() < 0.8:
            lines.append(json.dumps(_record(index, items[index])))
        for _ in range(int(rng.poisson(0.7))):
            lines.insert(int(rng.integers(len(lines) + 1)), _damaged_line(rng, items, indices))
    data = "".join(line + "\n" for line in lines).encode()
    gz = rng.random() < 0.3
    if gz:
        data = gzip.compress(data)
        if rng.random() < 0.7:
            data = data[:int(rng.integers(0, len(data) + 1))]
    elif rng.random() < 0.3 and data:
        data = data[:-int(rng.integers(1, 5))]                           # a torn last line
    path = folder / ("generations.jsonl.gz" if gz else "generations.jsonl")
    path.write_bytes(data)
    expected, seen = [], set()
    for line in _lines(data, gz):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if _usable(record, items) and record["index"] not in seen:
            seen.add(record["index"])
            expected.append(record)
    selection = [(index, SimpleNamespace(concepts=items[index])) for index in indices]
    if resume_records is not None:
        got = resume_records(folder, selection, [METHOD])
    else:
        got = run_records.read_records(folder)
    if got != expected:
        return (f"resume kept {len(got)} records, expected {len(expected)}: "
                f"{[r.get('index') for r in got]} vs {[r['index'] for r in expected]}")
    if gz:
        return None
    before = [line for line in data.decode("utf-8", errors="replace").split("\n") if line.strip()]
    with run_records.RecordWriter(path, got, **_writer_options(items)):
        pass
    kept = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    side_path = path.with_name(path.name + ".set-aside")
    aside = [json.loads(line)["text"] for line in side_path.read_text(encoding="utf-8").splitlines()] \
        if side_path.exists() else []
    if kept != expected:
        return "the resumed file does not hold exactly the kept records"
    if len(aside) + len(kept) != len(before):
        return f"{len(before) - len(aside) - len(kept)} line(s) lost on resume"
    return None


def _writer_options(items: dict) -> dict:
    if record_schema is None:
        return {}
    selection = [(index, SimpleNamespace(concepts=c)) for index, c in items.items()]
    return {"schema": record_schema(selection, [METHOD]), "selection": set(items)}


# ---------------------------------------------------------------------- two writers
def _second_writer_in_child(path: Path, previous: list[dict], records: list[dict]) -> int:
    """Open a second writer in a forked child: 3 when refused naming the holder (this parent),
    4 refused without naming it, 0 when it wrote ``records``, 5 on another error."""
    pid = os.fork()
    if pid == 0:
        torch.set_num_threads(1)          # the parent's OpenMP pool does not survive a fork
        code = 5
        try:
            try:
                writer = run_records.RecordWriter(path, previous)
            except CtrlgError as err:
                code = 3 if f"pid {os.getppid()}" in str(err) else 4
            else:
                for record in records:
                    writer.write(record)
                writer.close()
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status)


def case_two_writers(rng, folder: Path) -> str | None:
    path = folder / "generations.jsonl"
    previous = [_record(i, [f"c{i}"]) for i in range(int(rng.integers(0, 4)))]
    first = run_records.RecordWriter(path, previous)
    written = list(previous)
    next_index = len(previous)

    def new_record():
        nonlocal next_index
        next_index += 1
        return _record(next_index - 1, [f"c{next_index - 1}"])

    for _ in range(int(rng.integers(0, 3))):
        record = new_record()
        first.write(record)
        written.append(record)
    refused_right = None
    theirs = [new_record() for _ in range(int(rng.integers(1, 3)))]
    if rng.random() < 0.5:
        code = _second_writer_in_child(path, run_records.read_records(folder), theirs)
        if code == 0:
            written.extend(theirs)
        elif code == 5:
            return "the second writer failed with an unexpected error"
        refused_right = code == 3 if code else None
    else:
        try:
            second = run_records.RecordWriter(path, run_records.read_records(folder))
        except CtrlgError as err:
            refused_right = f"pid {os.getpid()}" in str(err)
        else:
            for record in theirs:
                second.write(record)
            written.extend(theirs)
            second.close()
    after = []
    for _ in range(int(rng.integers(1, 3))):
        record = new_record()
        try:
            first.write(record)
        except CtrlgError:
            pass                      # refused and set aside: checked below like a written one
        after.append(record)
    first.close()
    written.extend(after)
    if refused_right is False:
        return "the second writer was refused without naming the holder's pid"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    side = path.with_name(path.name + ".set-aside")
    lines += [json.loads(line)["text"] for line in side.read_text(encoding="utf-8").splitlines()] \
        if side.exists() else []
    found = {json.dumps(json.loads(line), sort_keys=True) for line in lines if line.strip()}
    lost = [r["index"] for r in written if json.dumps(r, sort_keys=True) not in found]
    return f"records {lost} were written and lost" if lost else None


# ---------------------------------------------------------------------- checkpoints
def random_hmm(rng, h=None, V=None) -> HMM:
    h = h or int(rng.integers(1, 6))
    V = V or int(rng.integers(2, 41))
    g = torch.Generator().manual_seed(int(rng.integers(2 ** 31)))
    return HMM.from_params(torch.softmax(torch.randn(h, generator=g), -1),
                           torch.softmax(torch.randn(h, h, generator=g), -1),
                           torch.softmax(torch.randn(h, V, generator=g) * 3, -1))


def _save(hmm, path, scheme, rng):
    if scheme == "bf16":
        return hmm.save(path, dtype=torch.bfloat16)
    if scheme == "topk8":
        return hmm.save(path, emission_quantization=f"topk8-{int(rng.integers(1, hmm.vocab_size + 1))}")
    return hmm.save(path, emission_quantization=scheme)


_CALLS = [(os, "rename"), (os, "replace"), (os, "link"), (os, "fsync"), (os, "unlink"),
          (os, "rmdir"), (shutil, "rmtree"), (shutil, "copy2")]


def save_killed_at(save, k: int) -> bool:
    """Run ``save()`` in a forked child that SIGKILLs itself just before the k-th system call
    (:data:`_CALLS`) of the publish step (:func:`ctrlg.checkpoint.publish`); True when it was
    killed, False when the save finished first."""
    pid = os.fork()
    if pid == 0:
        torch.set_num_threads(1)          # the parent's OpenMP pool does not survive a fork
        try:
            count, real_publish = [0], checkpoint.publish

            def counting(module, name):
                real = getattr(module, name)

                def call(*args, **kwargs):
                    count[0] += 1
                    if count[0] == k:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*args, **kwargs)
                return call

            def publish(*args, **kwargs):
                for module, name in _CALLS:
                    setattr(module, name, counting(module, name))
                return real_publish(*args, **kwargs)

            checkpoint.publish = publish
            save()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


def _params(hmm):
    return (hmm.initial, hmm.transition, hmm.emission)


def _same(a, b) -> bool:
    return all(x.shape == y.shape and torch.allclose(x, y) for x, y in zip(_params(a), _params(b)))


def _user_files(rng, path: Path) -> dict[str, bytes]:
    files = {}
    for i in range(int(rng.integers(0, 3))):
        name = f"notes{i}.txt" if rng.random() < 0.6 else f"runs/r{i}/log.txt"
        files[name] = os.urandom(int(rng.integers(0, 64)))
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return files


def case_kill_publish(rng, folder: Path) -> str | None:
    path = folder / "hmm"
    versions = []                          # (hmm as loaded back) of each save that may be there
    scheme = _scheme(rng, plain=0.6)
    old = random_hmm(rng)
    if rng.random() < 0.3:
        old.prior_head = PriorHead(4, old.hidden_size, inner_size=int(rng.integers(0, 3)))
    _save(old, path, scheme, rng)
    versions.append(HMM.load(path))
    files = _user_files(rng, path)
    for _ in range(int(rng.integers(1, 3))):
        new = random_hmm(rng, old.hidden_size, old.vocab_size)
        reference = folder / f"reference{len(versions)}"
        seed = int(rng.integers(2 ** 31))
        _save(new, reference, scheme, np.random.default_rng(seed))
        versions.append(HMM.load(reference))
        shutil.rmtree(reference)
        early = rng.random() < 0.6                 # publish makes ~8-25 calls, depending on files
        save_killed_at(lambda: _save(new, path, scheme, np.random.default_rng(seed)),
                       int(rng.integers(1, 12) if early else rng.integers(12, 30)))
    try:
        loaded = HMM.load(path)
    except CheckpointError as err:
        return f"no checkpoint at the path after the kill: {err}"
    if not any(_same(loaded, v) for v in versions):
        return "the checkpoint at the path is none of the saved ones"
    for name, data in files.items():
        if not (path / name).is_file() or (path / name).read_bytes() != data:
            return f"the user's file {name} is lost or changed"
    last = random_hmm(rng, old.hidden_size, old.vocab_size)
    last.save(path)
    if not _same(HMM.load(path), last):
        return "the save after the kill did not take"
    left = sorted(p.name for p in folder.iterdir() if p.name != "hmm")
    return f"left beside the checkpoint: {left}" if left else None


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def case_bit_flip(rng, folder: Path) -> str | None:
    hmm = random_hmm(rng, int(rng.integers(4, 17)), int(rng.integers(50, 201)))  # data > header
    with_head = rng.random() < 0.4
    if with_head:
        hmm.prior_head = PriorHead(4, hmm.hidden_size, inner_size=int(rng.integers(0, 3)))
    path = folder / "hmm"
    _save(hmm, path, _scheme(rng), rng)
    name = "prior_head.safetensors" if with_head and rng.random() < 0.5 else "model.safetensors"
    data = bytearray((path / name).read_bytes())
    bit = int(rng.integers(len(data) * 8))
    data[bit // 8] ^= 1 << (bit % 8)
    (path / name).write_bytes(bytes(data))
    try:
        HMM.load(path)
    except CheckpointError:
        return None
    return f"bit {bit} of {name} flipped, and the checkpoint loaded"


def _integer(rng, dtype) -> int:
    """A random value of the integer ``dtype``, often outside a vocabulary's [0, V)."""
    info = torch.iinfo(dtype)
    return int(rng.integers(max(info.min, -70000), min(info.max, 70000) + 1))


def _misfit(rng, t: torch.Tensor) -> torch.Tensor:
    choice = int(rng.integers(9))
    if choice == 0:
        return t.flatten()
    if choice == 1 and t.dim() >= 1 and t.shape[0] > 1:
        return t[:t.shape[0] - 1].contiguous()
    if choice == 2:
        return t.to(torch.float32) if t.dtype != torch.float32 else t.to(torch.int32)
    if choice == 3 and t.is_floating_point():
        return torch.full_like(t, float(rng.choice([float("nan"), float("inf"), -1.0, 0.0])))
    if choice == 4 and not t.is_floating_point():
        return torch.full_like(t, _integer(rng, t.dtype))
    if choice == 5:
        return t.repeat(*([2] + [1] * (t.dim() - 1))) if t.dim() else t[None]
    if choice == 6 and t.dim() == 2:
        return t.t().contiguous()
    if choice == 7 and not t.is_floating_point():
        flat = t.flatten().clone()
        flat[int(rng.integers(flat.numel()))] = _integer(rng, t.dtype) if rng.random() < 0.3 \
            else int(rng.integers(0, 50))
        return flat.reshape(t.shape)
    return t[None]


def _is_distribution(hmm) -> bool:
    return all(bool(torch.isfinite(p).all()) and bool((p >= 0).all()) and
               bool(torch.allclose(p.sum(-1), torch.ones(()), atol=1e-3)) for p in _params(hmm))


BAD_SCHEMES = (5, ["log8"], {"log8": 1}, "", "log9", "topk8-0", "topk8--3", True, 2.5, "LOG8")


def case_bad_quantized(rng, folder: Path) -> str | None:
    hmm = random_hmm(rng, V=int(rng.integers(3, 41)))
    path = folder / "hmm"
    scheme = str(rng.choice(["log8", "normq8", "topk8"]))
    if rng.random() < 0.25:
        bad = BAD_SCHEMES[int(rng.integers(len(BAD_SCHEMES)))]
        try:
            hmm.save(path, emission_quantization=bad)
        except CheckpointError:
            pass
        except Exception as err:                                      # noqa: BLE001
            return f"save(emission_quantization={bad!r}) raised {type(err).__name__}: {err}"
        else:
            return f"save(emission_quantization={bad!r}) was accepted"
        _save(hmm, path, scheme, rng)
        change = {"emission_quantization": bad}
        tensors = None
    else:
        _save(hmm, path, scheme, rng)
        with safe_open(str(path / "model.safetensors"), "pt") as handle:
            metadata = handle.metadata()
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}
        name = str(rng.choice(sorted(k for k in tensors if k.startswith("emission_"))))
        tensors[name] = _misfit(rng, tensors[name]).contiguous()
        save_file(tensors, str(path / "model.safetensors"), metadata=metadata)
        change = {}
    config = json.loads((path / "config.json").read_text())
    config.update(change)
    config["checksums"] = {"model.safetensors": _sha(path / "model.safetensors")}
    (path / "config.json").write_text(json.dumps(config))
    try:
        loaded = HMM.load(path)
    except CheckpointError:
        return None
    if tensors is None:
        return f"emission_quantization {change['emission_quantization']!r} in config.json loaded"
    return None if _is_distribution(loaded) else "a damaged checkpoint loaded as a non-distribution"


CASES = {"records": case_records, "two_writers": case_two_writers,
         "kill_publish": case_kill_publish, "bit_flip": case_bit_flip,
         "bad_quantized": case_bad_quantized}


def run_case(seed: int, kinds: tuple[str, ...] = KINDS) -> dict:
    rng = np.random.default_rng(seed)
    kind = kinds[int(rng.integers(len(kinds)))]
    case = {"seed": seed, "kind": kind}
    folder = Path(tempfile.mkdtemp(prefix="ctrlg-fuzz-storage-"))
    try:
        return {**case, "violation": CASES[kind](rng, folder)}
    except Exception as err:                                         # noqa: BLE001 - fuzzing
        return {**case, "violation": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=6)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_campaign(cases: int, seed: int = 0, progress: bool = False,
                 kinds: tuple[str, ...] = KINDS) -> dict:
    """Run ``cases`` cases of ``kinds`` with seeds ``seed, seed + 1, ...``; returns the summary
    dict."""
    start = time.perf_counter()
    by_kind, bad_by_kind, violations = Counter(), Counter(), []
    for i in range(cases):
        result = run_case(seed + i, kinds)
        by_kind[result["kind"]] += 1
        if result["violation"]:
            bad_by_kind[result["kind"]] += 1
            violations.append(result)
        if progress and (i + 1) % 250 == 0:
            print(f"  {i + 1}/{cases} cases, {len(violations)} violations, "
                  f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return dict(cases=cases, seed=seed, violations=len(violations),
                by_kind={k: dict(cases=by_kind[k], violations=bad_by_kind[k]) for k in kinds},
                seconds=round(time.perf_counter() - start, 1), first_violations=violations[:20])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/fuzz_storage.json")
    parser.add_argument("--replay", type=int, default=None, help="run one case and print it")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds)
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)        # the set-aside warnings of thousands of damaged files
    if args.replay is not None:
        print(json.dumps(run_case(args.replay, kinds), indent=2, default=str))
        return 0
    summary = run_campaign(args.cases, args.seed, progress=True, kinds=kinds)
    print(json.dumps({k: v for k, v in summary.items() if k != "first_violations"}, indent=2))
    for v in summary["first_violations"][:5]:
        print("VIOLATION", json.dumps(v, default=str)[:600])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2, default=str))
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
