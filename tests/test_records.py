"""Record files that survive damage (ctrlg.tasks.record_files, ctrlg.tasks.records): a corrupt line in the
middle or a torn last line never costs a finished record; bad lines are set aside and named."""

import gzip
import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrlg.tasks import record_files as records
from ctrlg.tasks.records import RecordWriter, read_records
from test_commongen import small_overrides
from test_experiments import compose, tiny_hmm_dir, tiny_lm_dir  # noqa: F401 (fixtures)


def rows(*indices):
    return [{"index": i, "text": f"item {i} — é"} for i in indices]


def write_lines(path, lines, newline_at_end=True):
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines)
    path.write_bytes(data + (b"\n" if newline_at_end else b""))


def dumps(record):
    return json.dumps(record, ensure_ascii=False)


def side_rows(path):
    side = records.set_aside_path(path)
    return [json.loads(line) for line in side.read_text(encoding="utf-8").splitlines()]


def test_a_corrupt_middle_line_keeps_every_good_record_after_it(tmp_path, caplog):
    path = tmp_path / "generations.jsonl"
    good = rows(0, 1, 2, 3)
    write_lines(path, [dumps(good[0]), dumps(good[1]), '{"index": 2, "te', dumps(good[2]),
                       dumps(good[3])])
    with caplog.at_level(logging.WARNING):
        got = read_records(tmp_path)
    assert got == good                                   # before: [item 0, item 1]
    assert "generations.jsonl" in caplog.text and "line 3" in caplog.text
    assert "generations.jsonl.set-aside" in caplog.text


@pytest.mark.parametrize("bad, reason", [
    (b'{"index": 1, "te', "not JSON"),
    (b"\xff\xfe garbage", "not UTF-8"),
    (b"[1, 2]", "list, not an object"),
    (b'{"text": "no index"}', "without 'index'"),
])
def test_each_kind_of_bad_line_is_named_with_its_reason(tmp_path, bad, reason):
    path = tmp_path / "generations.jsonl"
    write_lines(path, [dumps(rows(0)[0]), bad, dumps(rows(2)[0])])
    found = records.read_records(path, required=("index",))
    assert [r["index"] for r in found.records] == [0, 2] and found.numbers == [1, 3]
    assert [b.number for b in found.bad] == [2] and reason in found.bad[0].reason


def test_a_torn_last_line_is_named_as_an_interrupted_write(tmp_path):
    path = tmp_path / "generations.jsonl"
    write_lines(path, [dumps(rows(0)[0]), dumps(rows(1)[0]), '{"index": 2, "text": "it'],
                newline_at_end=False)
    found = records.read_records(path)
    assert [r["index"] for r in found.records] == [0, 1]
    assert found.bad[0].number == 3 and "torn last line" in found.bad[0].reason


def test_resume_in_place_sets_bad_lines_aside_and_deletes_no_finished_record(tmp_path, caplog):
    """The lost-data case: before, RecordWriter reopened the file with "w" after read_records
    had stopped at line 2, so items 2 and 3 (finished) were deleted."""
    path = tmp_path / "generations.jsonl"
    good = rows(0, 2, 3)
    corrupt = '{"index": 1, "text": "half a rec'
    write_lines(path, [dumps(good[0]), corrupt, dumps(good[1]), dumps(good[2]),
                       '{"index": 4, "te'], newline_at_end=False)
    previous = read_records(tmp_path)
    assert previous == good
    with caplog.at_level(logging.WARNING), RecordWriter(path, previous) as writer:
        writer.write(rows(1)[0])
        writer.write(rows(4)[0])
    assert read_records(tmp_path) == good + rows(1, 4)     # nothing finished was lost
    assert path.read_text(encoding="utf-8").endswith("\n")
    aside = side_rows(path)
    assert [(a["source"], a["line"], a["text"]) for a in aside] == \
        [("generations.jsonl", 2, corrupt), ("generations.jsonl", 5, '{"index": 4, "te')]
    assert "torn last line" in aside[1]["reason"]
    assert "generations.jsonl.set-aside" in caplog.text and "line 2" in caplog.text
    # a second resume finds a clean file and sets nothing more aside
    RecordWriter(path, read_records(tmp_path)).close()
    assert len(side_rows(path)) == 2 and read_records(tmp_path) == good + rows(1, 4)


def test_a_writer_over_a_file_of_other_records_sets_them_aside(tmp_path):
    """Even records that are not being resumed are moved to the side file, not deleted."""
    path = tmp_path / "generations.jsonl"
    write_lines(path, [dumps(r) for r in rows(0, 1)])
    RecordWriter(path, rows(0)).close()
    assert read_records(tmp_path) == rows(0)
    assert [json.loads(a["text"]) for a in side_rows(path)] == rows(1)


def test_the_writer_replaces_the_file_atomically(tmp_path, monkeypatch):
    """A failure while the resumed records are staged leaves the old file whole."""
    path = tmp_path / "generations.jsonl"
    write_lines(path, [dumps(r) for r in rows(0, 1)])
    before = path.read_bytes()

    def failing_replace(*args):
        raise OSError("disk full")

    monkeypatch.setattr(records.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        RecordWriter(path, rows(0, 1))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["generations.jsonl"]   # no staging left


def test_a_gzip_run_with_a_corrupt_line_is_read_past_it(tmp_path):
    with gzip.open(tmp_path / "generations.jsonl.gz", "wb") as handle:
        handle.write(b"\n".join([dumps(rows(0)[0]).encode(), b"{oops", dumps(rows(1)[0]).encode()])
                     + b"\n")
    assert read_records(tmp_path) == rows(0, 1)


def test_a_resumed_commongen_run_with_a_corrupt_line_decodes_only_what_is_missing(
        tiny_lm_dir, tiny_hmm_dir, tmp_path, monkeypatch):
    """End to end: a finished 4-item run, its line 2 corrupted, resumed in place: items 0, 2
    and 3 are kept as they were, only item 1 is decoded again, and the corrupt line is in the
    side file."""
    from experiments import commongen

    overrides = small_overrides(tiny_lm_dir, tiny_hmm_dir, "data.limit=4", "batch_size=1")
    run = tmp_path / "run"
    commongen.run(compose("commongen", overrides), run)
    path = run / "generations.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    finished = [json.loads(line) for line in lines]
    damaged = lines[1][: len(lines[1]) // 2]
    path.write_text("\n".join([lines[0], damaged, *lines[2:]]) + "\n", encoding="utf-8")

    from ctrlg.tasks.commongen import pipeline

    decoded = []
    real = pipeline.decode_batch

    def counting(ready, *args, **kwargs):
        decoded.extend(record["index"] for record, _, _ in ready)
        return real(ready, *args, **kwargs)

    monkeypatch.setattr(pipeline, "decode_batch", counting)
    table = commongen.run(compose("commongen", overrides + [f"resume={run}"]), run)
    assert decoded == [1]                                  # before: [1, 2, 3]
    after = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert sorted(r["index"] for r in after) == [0, 1, 2, 3]
    by_index = {r["index"]: r for r in after}
    for old in (finished[0], finished[2], finished[3]):   # kept byte for byte (as JSON)
        assert by_index[old["index"]] == old
    assert by_index[1]["logical"]["text"] == finished[1]["logical"]["text"]  # same seed
    assert [a["line"] for a in side_rows(path)] == [2] and side_rows(path)[0]["text"] == damaged
    assert table["ctrlg"]["success"] == 100.0


GOOD = st.builds(lambda i, t: {"index": i, "text": t}, st.integers(0, 10**6),
                 st.text(max_size=12))
BAD = st.one_of(st.binary(min_size=1, max_size=12).filter(lambda b: b"\n" not in b),
                st.sampled_from([b'{"index": 1, "te', b"[]", b'"x"', b"{}", b"\xff{", b"nul"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.one_of(GOOD, BAD), max_size=12), torn=st.booleans())
def test_no_line_is_ever_lost_by_a_resume_in_place(tmp_path_factory, lines, torn):
    """Property: for any mix of good and bad lines (and a torn end), the reader returns exactly
    the good records in order, and after a resume in place every original non-blank line is
    either a record of the file or a line of the side file (under its own line number)."""
    folder = tmp_path_factory.mktemp("run")
    path = folder / "generations.jsonl"
    raw = [dumps(x).encode() if isinstance(x, dict) else x for x in lines]
    write_lines(path, raw, newline_at_end=not torn)
    found = records.read_records(path, required=("index",))
    # a "bad" line that happens to be a good record (e.g. {"index": ...}) is counted as good
    oracle = []
    for n, line in enumerate(raw, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(value, dict) and "index" in value:
            oracle.append((n, value))
    assert list(zip(found.numbers, found.records)) == oracle
    assert len(oracle) >= sum(isinstance(x, dict) for x in lines)
    RecordWriter(path, found.records).close()
    kept = records.read_records(path).records
    aside = side_rows(path) if records.set_aside_path(path).exists() else []
    assert kept == [v for _, v in oracle]
    numbers = {a["line"] for a in aside} | set(found.numbers)
    assert numbers == {n for n, line in enumerate(raw, 1) if line.strip()}
    for row in aside:                                      # the text itself, not a summary
        assert row["text"] == raw[row["line"] - 1].decode("utf-8", errors="backslashreplace")
