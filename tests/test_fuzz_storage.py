"""A small run of the storage fuzz campaign (benchmarks/fuzz_storage.py): damaged run records,
two writers, kills inside a checkpoint save, bit flips and bad quantised data all meet their
oracles, and the campaign does catch a library that skips a check."""

from benchmarks.fuzz_storage import KINDS, run_campaign


def test_small_storage_campaign_has_no_violations():
    summary = run_campaign(cases=40, seed=2024)
    assert summary["violations"] == 0, summary["first_violations"][:3]
    assert all(summary["by_kind"][kind]["cases"] > 0 for kind in KINDS)


def test_storage_campaign_catches_a_load_that_skips_the_checksums(monkeypatch):
    from ctrlg.hmm import model

    monkeypatch.setattr(model, "check_checksums", lambda folder, checksums: None)
    summary = run_campaign(cases=12, seed=3, kinds=("bit_flip",))
    assert summary["by_kind"]["bit_flip"]["violations"] > 0


def test_storage_campaign_catches_a_resume_that_keeps_every_record(monkeypatch):
    import benchmarks.fuzz_storage as campaign
    from ctrlg.tasks.records import read_records

    monkeypatch.setattr(campaign, "resume_records", lambda folder, items, methods:
                        read_records(folder))
    summary = run_campaign(cases=30, seed=3, kinds=("records",))
    assert summary["by_kind"]["records"]["violations"] > 0
