"""Resuming a run from records that are wrong rather than torn: records checked against the
run's schema and selection and deduplicated (the misfits set aside with their reasons), gzip
copies that break off, and one writer per run folder (a lock naming its holder, released when
its process dies)."""

import gzip
import json
import logging
import os
import signal
import threading
import time

import pytest

from ctrlg.errors import ExperimentConfigError
from ctrlg.tasks import record_files
from ctrlg.tasks.record_files import LOCK_NAME, RecordSchema, lock_run_folder
from ctrlg.tasks.records import RecordWriter, read_records
from test_commongen import small_overrides
from test_experiments import compose, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)

SCHEMA = RecordSchema(fields={"index": int, "references": list})


def good(i, text="ok"):
    return {"index": i, "references": [f"ref {i}"], "text": text}


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines),
                    encoding="utf-8")


def side_rows(path):
    return [json.loads(line) for line in
            record_files.set_aside_path(path).read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("bad, reason", [
    (good(1, "second"), "a second record of index 1 (line 2 holds the first"),
    (good(7), "index 7 is not among the items this run selects"),
    ({**good(3), "index": "1"}, "'index' is a str (\"1\"), not a int"),
    ({**good(3), "index": True}, "'index' is a bool"),
    ({**good(3), "index": 2.0}, "'index' is a float"),
    ({"index": 1}, "without 'references'"),
    ({**good(3), "references": "one"}, "'references' is a str"),
    ({"index": [1]}, "without 'references'"),
])
def test_misfit_records_are_set_aside_with_their_reason(tmp_path, caplog, bad, reason):
    """Before, a duplicate, a foreign index or an index "1" was scored (``items: 5`` for
    ``data.limit=4``) and ``{"index": 1}`` crashed the resume with KeyError. Now each is a bad
    line of the resume: skipped with a warning, set aside (never deleted) by the writer."""
    path = tmp_path / "generations.jsonl"
    write(path, [good(0), good(1), bad, good(2)])
    selection = {0, 1, 2, 3}
    with caplog.at_level(logging.WARNING):
        kept = read_records(tmp_path, schema=SCHEMA, selection=selection)
    assert kept == [good(0), good(1), good(2)]
    assert "line 3" in caplog.text and reason in caplog.text
    RecordWriter(path, kept, schema=SCHEMA, selection=selection).close()
    assert read_records(tmp_path) == kept
    aside = side_rows(path)
    assert [a["line"] for a in aside] == [3] and reason in aside[0]["reason"]
    assert json.loads(aside[0]["text"]) == bad


def test_the_first_record_of_an_item_wins_and_multi_field_keys_work(tmp_path):
    schema = RecordSchema(fields={"index": int, "ratio": float}, key=("ratio", "index"))
    path = tmp_path / "generations.jsonl"
    rows = [{"index": 0, "ratio": 0.5, "t": "a"}, {"index": 0, "ratio": 0.25, "t": "b"},
            {"index": 0, "ratio": 0.5, "t": "c"}, {"index": 1, "ratio": 0.5, "t": "d"}]
    write(path, rows)
    found = record_files.read_records(path, schema=schema, selection={(0.5, 0), (0.25, 0)})
    assert [r["t"] for r in found.records] == ["a", "b"]
    assert [(b.number, b.reason.split(" (")[0]) for b in found.bad] == [
        (3, "a second record of ratio 0.5, index 0"),
        (4, "ratio 0.5, index 1 is not among the items this run selects")]


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95, 1.0, "header"])
def test_a_truncated_gzip_copy_keeps_every_line_before_the_break(tmp_path, cut):
    """Before, ``EOFError`` ended the resume and lost every good record of the file."""
    rows = [good(i, "é" * 40) for i in range(50)]
    data = gzip.compress("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
    keep = 5 if cut == "header" else int(len(data) * cut) - (1 if cut == 1.0 else 0)
    (tmp_path / "generations.jsonl.gz").write_bytes(data[:keep])
    found = record_files.read_records(tmp_path / "generations.jsonl.gz", required=("index",))
    n = len(found.records)
    assert found.records == rows[:n]
    assert found.bad and "gzip stream breaks off" in found.bad[-1].reason
    if cut in (0.6, 0.95):
        assert n > 0
    assert read_records(tmp_path) == rows[:n]


def test_a_corrupt_gzip_stream_keeps_what_came_before(tmp_path):
    rows = [good(i) for i in range(200)]
    data = bytearray(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "generations.jsonl.gz").write_bytes(bytes(data))
    found = record_files.read_records(tmp_path / "generations.jsonl.gz")
    assert found.records == rows[:len(found.records)] and found.bad


# ------------------------------------------------------------------------- two writers
def test_a_second_writer_on_the_same_folder_is_refused_naming_the_holder(tmp_path):
    """Before, a second RecordWriter replaced the file while the first kept appending to the
    unlinked old one: its records were lost, not even set aside."""
    path = tmp_path / "generations.jsonl"
    first = RecordWriter(path, [good(0)])
    with pytest.raises(ExperimentConfigError, match=rf"in use.*pid {os.getpid()} .*this process"):
        RecordWriter(path, [good(0)])
    first.write(good(1))
    first.close()
    assert not (tmp_path / LOCK_NAME).exists()                 # released and removed
    with RecordWriter(path, read_records(tmp_path)) as second:
        second.write(good(2))
    assert read_records(tmp_path) == [good(0), good(1), good(2)]


def _holder(folder):
    """A forked process that takes the folder's lock and sleeps (the parent SIGKILLs it)."""
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                                # the child: never returns
        try:
            os.close(read)
            lock = lock_run_folder(folder)           # held until the process dies
            os.write(write_end, b"locked")
            time.sleep(120)
            lock.release()
        finally:
            os._exit(0)
    os.close(write_end)
    assert os.read(read, 6) == b"locked"
    os.close(read)
    return pid


def test_another_process_holds_the_lock_and_a_killed_one_does_not(tmp_path, tiny_lm_dir,
                                                                  tiny_hmm_dir):
    """While another process holds the folder's lock, a writer is refused, and so is a whole
    run before it touches the folder's config.yaml; once that process is killed (its lock file
    left behind), the lock is free."""
    from experiments import commongen

    (tmp_path / "config.yaml").write_text("the first run's\n")
    pid = _holder(tmp_path)
    try:
        with pytest.raises(ExperimentConfigError, match=rf"pid {pid} .*another process"):
            RecordWriter(tmp_path / "generations.jsonl", [good(0)])
        with pytest.raises(ExperimentConfigError, match=f"pid {pid}"):
            commongen.run(compose("commongen", small_overrides(tiny_lm_dir, tiny_hmm_dir)),
                          tmp_path)
        assert (tmp_path / "config.yaml").read_text() == "the first run's\n"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert (tmp_path / LOCK_NAME).exists()                      # stale: left by the killed run
    with RecordWriter(tmp_path / "generations.jsonl", [good(0)]) as writer:
        writer.write(good(1))
    assert read_records(tmp_path) == [good(0), good(1)]


def test_a_writer_can_wait_for_the_lock(tmp_path):
    lock = lock_run_folder(tmp_path)
    threading.Timer(0.3, lock.release).start()
    start = time.monotonic()
    with RecordWriter(tmp_path / "generations.jsonl", [good(0)], lock_wait=10):
        assert time.monotonic() - start >= 0.25


def test_a_file_replaced_under_a_writer_stops_it_without_losing_the_record(tmp_path):
    path = tmp_path / "generations.jsonl"
    writer = RecordWriter(path, [good(0)])
    staging = tmp_path / "other"
    staging.write_text(json.dumps(good(9)) + "\n")
    os.replace(staging, path)                                   # something else replaced it
    with pytest.raises(ExperimentConfigError, match="replaced or removed"):
        writer.write(good(1))
    writer.close()
    assert json.loads(side_rows(path)[0]["text"]) == good(1)


# ------------------------------------------------------------------------- end to end
def test_a_resumed_commongen_run_scores_each_selected_item_once(tiny_lm_dir, tiny_hmm_dir,
                                                                tmp_path, monkeypatch):
    """A finished 4-item run plus a second record of item 1, a record of item 7 (not
    selected), one whose index is "2", one that is only ``{"index": 3}``: resumed in place, the
    metrics are those of the finished run (``items: 4``), nothing is decoded again, and the
    four lines are in the side file with their reasons."""
    from ctrlg.tasks.commongen import pipeline
    from experiments import commongen

    overrides = small_overrides(tiny_lm_dir, tiny_hmm_dir, "data.limit=4", "batch_size=2")
    run = tmp_path / "run"
    commongen.run(compose("commongen", overrides), run)
    before = json.loads((run / "metrics.json").read_text())
    path = run / "generations.jsonl"
    finished = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    second = {**finished[1], "ctrlg": {**finished[1]["ctrlg"], "text": "something else"}}
    foreign = {**finished[2], "index": 7}
    text_index = {**finished[2], "index": "2"}
    with path.open("a", encoding="utf-8") as handle:
        for extra in (second, foreign, text_index, {"index": 3}):
            handle.write(json.dumps(extra, ensure_ascii=False) + "\n")

    decoded = []
    real = pipeline.decode_batch
    monkeypatch.setattr(pipeline, "decode_batch", lambda ready, *a, **k: (
        decoded.extend(r["index"] for r, _, _ in ready), real(ready, *a, **k))[1])
    commongen.run(compose("commongen", overrides + [f"resume={run}"]), run)
    after = json.loads((run / "metrics.json").read_text())
    assert decoded == [] and after["items"] == 4
    assert after["methods"] == before["methods"]
    reasons = [a["reason"] for a in side_rows(path)]
    assert len(reasons) == 4 and "a second record of index 1" in reasons[0]
    assert "not among the items" in reasons[1] and "is a str" in reasons[2]
    assert "without 'concepts'" in reasons[3]


def test_a_key_of_another_type_is_not_a_selected_item_even_without_field_types(tmp_path):
    """``True`` and ``1.0`` equal ``1`` in Python; they are not the item 1 of the selection."""
    path = tmp_path / "generations.jsonl"
    write(path, [{"index": 1}, {"index": True}, {"index": 1.0}, {"index": [1]}])
    found = record_files.read_records(path, schema=RecordSchema(), selection={1})
    assert found.records == [{"index": 1}]
    assert [b.reason.split(" is ")[0] for b in found.bad[:2]] == ["index true", "index 1.0"]
    assert "not a plain value" in found.bad[2].reason
