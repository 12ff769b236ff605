"""benchmarks/json_guidance_quality's summary: paired differences against logical masking and
against a reference mode, and a saved run summarised again without generating."""

import json

import numpy as np
import pytest

from benchmarks import json_guidance_quality as quality


def _doc(loglik, tokens, ended=True):
    return {"text": "{}", "tokens": tokens, "ended": ended, "valid": True, "loglik": loglik}


def _rows():
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        row = {"file": f"s{i}.json"}
        for mode, shift in (("logical", 0.0), ("h1", -0.5), ("h4", -0.2)):
            docs = [_doc(float(-10 + shift * 10 + rng.normal()), 10) for _ in range(3)]
            row[mode] = {"seconds": 1.0, "docs": docs}
        rows.append(row)
    return rows


def test_differences_are_paired_per_schema_against_logical_and_the_reference():
    rows = _rows()
    summary = quality.summarise(rows, ["logical", "h1", "h4"], "h4", resamples=200, seed=0)

    def per_schema(mode):
        return np.array([np.mean([d["loglik"] / d["tokens"] for d in r[mode]["docs"]])
                         for r in rows])

    for mode in ("h1", "h4"):
        want = float(np.mean(per_schema(mode) - per_schema("logical")))
        assert summary[mode]["loglik_per_token_minus_logical"] == pytest.approx(want)
        lo, hi = summary[mode]["loglik_per_token_minus_logical_ci95"]
        assert lo <= want <= hi
    want = float(np.mean(per_schema("h1") - per_schema("h4")))
    assert summary["h1"]["loglik_per_token_minus_h4"] == pytest.approx(want)
    assert "loglik_per_token_minus_h4" not in summary["h4"]
    assert "loglik_per_token_minus_logical" not in summary["logical"]


def test_a_saved_run_is_summarised_again_without_generating(tmp_path, capsys):
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"summary": {}, "rows": _rows()}))
    out = tmp_path / "again.json"
    quality.main(["--rescore", str(saved), "--reference", "h4", "--out", str(out)])
    again = json.loads(out.read_text())
    assert set(again["summary"]) == {"logical", "h1", "h4"}
    assert "loglik_per_token_minus_h4" in again["summary"]["h1"]
    assert "minus h4" in capsys.readouterr().out


def test_a_run_without_data_is_refused():
    with pytest.raises(SystemExit):
        quality.main(["--modes", "logical"])
