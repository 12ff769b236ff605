"""The GPU benchmark harness (benchmarks/gpu) at tiny size on CPU: every section runs, timings
are positive, kernel results agree with their torch references, and fractions of peak come from
the documented peak table (None on CPU)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `benchmarks` is a folder of the repository, not an installed package

from benchmarks.gpu.peaks import PEAKS, fraction_of_bandwidth, fractions_of_peak, peak_for  # noqa: E402
from benchmarks.gpu.report import device_slug, format_cell  # noqa: E402
from benchmarks.gpu.timing import Stopwatch, measure  # noqa: E402

SECTIONS = ("em_estep", "backward_table", "guidance_overhead", "distill_at_scale", "commongen_large")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Run ``python -m benchmarks.gpu --device cpu --size tiny`` once in a subprocess (so that
    TRITON_INTERPRET=1 is set before Triton is imported) and load its JSON. One torch thread: the
    shapes are tiny, and on a busy 2-core machine OpenMP hand-offs cost more than the work."""
    out = tmp_path_factory.mktemp("gpu_bench")
    env = dict(os.environ, TRITON_INTERPRET="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--device", "cpu", "--size", "tiny",
                           "--threads", "1", "--out", str(out), "--work-dir", str(out / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(out.glob("gpu_*_tiny.json"))
    assert len(files) == 1, list(out.iterdir())
    assert files[0].with_suffix(".md").is_file()
    return json.loads(files[0].read_text()), files[0].with_suffix(".md").read_text()


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_every_section_ran_with_positive_timings(tiny_run):
    results, md = tiny_run
    meta = results["meta"]
    assert meta["device"] == "cpu" and meta["device_name"] and meta["size"] == "tiny"
    assert meta["peak"] is None
    for name in SECTIONS:
        section = results["sections"][name]
        assert "error" not in section, section.get("error")
        assert section["rows"], f"{name} has no rows"
        assert f"## {name}" in md
    for row in results["sections"]["em_estep"]["rows"]:
        assert _positive(row["median_s"]) and _positive(row["tokens_per_s"]) and _positive(row["tflops"])
    for row in results["sections"]["backward_table"]["rows"]:
        assert _positive(row["median_s"]) and _positive(row["tflops"])
    for row in results["sections"]["guidance_overhead"]["rows"]:
        assert _positive(row["lm_step_s"]) and _positive(row["guidance_step_s"])
        assert row["overhead"] == pytest.approx(row["guidance_step_s"] / row["lm_step_s"])
        assert row["guidance_steps_timed"] == row["max_new_tokens"]
        assert row["accepted_fraction"] == 1.0  # the guide never lets a row miss the constraint
    distill = results["sections"]["distill_at_scale"]
    assert _positive(distill["timings_s"]["total_s"])
    lls = {row["model"]: row["heldout_ll_per_token"] for row in distill["rows"]}
    assert math.isfinite(lls["distilled HMM"]) and lls["distilled HMM"] < 0
    # a trained HMM beats the unigram baseline on held-out samples, even at this size
    assert lls["distilled HMM"] > lls["unigram"]
    # the prior head trained with the HMM: filtering and head rows for each prefix length
    head_rows = [m for m in lls if m.startswith(("HMM filtering, after", "HMM + prior head, after"))]
    assert head_rows and all(math.isfinite(lls[m]) and lls[m] < 0 for m in head_rows)
    assert any(m.startswith("HMM + prior head") for m in head_rows)
    # the main job with both HMMs: paired (logical uses no HMM, so its rows are identical)
    commongen = results["sections"]["commongen_large"]
    assert commongen["logical_rows_identical"]
    assert {(r["hmm"].split()[0], r["method"]) for r in commongen["rows"]} == \
        {(h, m) for h in ("embedded", "large") for m in ("logical", "ctrlg_w075")}
    assert all(r["success"] == 100.0 for r in commongen["rows"] if r["method"] != "unconstrained")


def test_torch_rows_present_and_kernels_agree_with_torch(tiny_run):
    results, _ = tiny_run
    for name in ("em_estep", "backward_table"):
        rows = results["sections"][name]["rows"]
        assert any(r["impl"] == "torch" for r in rows)
        kernel_rows = [r for r in rows if r["impl"] == "triton"]
        skipped = [s for s in results["sections"][name]["skipped"] if s["impl"] == "triton"]
        assert kernel_rows or skipped, f"{name}: the kernel neither ran nor says why it was skipped"
        for row in kernel_rows:
            tolerance = 1e-4 if row.get("dtype", "float32") == "float32" else 1e-2
            assert row["max_rel_err_vs_torch"] <= tolerance, row
    assert any(r["impl"] == "triton" for r in results["sections"]["backward_table"]["rows"]), \
        results["sections"]["backward_table"]["skipped"]


def test_fractions_of_peak_are_none_on_cpu(tiny_run):
    results, _ = tiny_run
    for name in ("em_estep", "backward_table"):
        for row in results["sections"][name]["rows"]:
            assert row["fraction_of_peak"] is None and row["fraction_of_bandwidth"] is None


def test_peak_table_matches_datasheet_and_device_names():
    sxm = peak_for("NVIDIA H100 80GB HBM3")
    assert sxm is PEAKS["H100 SXM"]
    assert (sxm.bf16_flops, sxm.tf32_flops, sxm.fp32_flops) == (989e12, 494.5e12, 67e12)
    pcie = peak_for("NVIDIA H100 PCIe")
    assert (pcie.bf16_flops, pcie.tf32_flops, pcie.fp32_flops) == (756e12, 378e12, 51e12)
    h200 = peak_for("NVIDIA H200")
    assert (h200.bf16_flops, h200.tf32_flops, h200.fp32_flops) == (989e12, 494.5e12, 67e12)
    assert peak_for("AMD EPYC 7B13") is None and peak_for(None) is None
    assert peak_for("NVIDIA GeForce RTX 4090") is None


def test_fraction_of_peak_arithmetic():
    from benchmarks.gpu import backward_table, em_estep
    from benchmarks.gpu.timing import Timing

    peak = PEAKS["H100 SXM"]
    assert fractions_of_peak(494.5e12, peak) == {"bf16": 0.5, "tf32": 1.0, "fp32": 494.5 / 67}
    assert fractions_of_peak(1e12, None) is None
    assert fraction_of_bandwidth(3.35e12 / 2, peak) == pytest.approx(0.5)
    # backward step: S = 1000, h = 4096 in 1 ms -> 2·S·h² FLOPs (+ gathers) per ms
    timing = Timing(1e-3, 1e-3, 1e-3, [1e-3])
    row = backward_table._row("triton", torch.bfloat16, 1000, 4096, 6000, timing, peak)
    flops = 2 * 1000 * 4096**2 + 3 * 1000 * 4096 + 3 * 6000 * 4096
    assert row["tflops"] == pytest.approx(flops / 1e-3 / 1e12)
    assert row["fraction_of_peak"]["bf16"] == pytest.approx(flops / 1e-3 / 989e12)
    # E-step: 6h² per token
    row = em_estep._row("torch", 1024, 256, 32, timing, peak)
    assert row["tokens_per_s"] == pytest.approx(256 * 32 / 1e-3)
    assert row["fraction_of_peak"]["fp32"] == pytest.approx(6 * 1024**2 * 256 * 32 / 1e-3 / 67e12)


def test_timing_utilities_and_formatting():
    calls = []
    timing = measure(lambda: calls.append(1), "cpu", warmup=2, repeats=3)
    assert len(calls) == 5 and len(timing.repeats) == 3
    assert 0 < timing.min_s <= timing.median_s <= timing.max_s
    watch = Stopwatch("cpu", wall=True)
    for _ in range(3):
        with watch:
            sum(range(1000))
    assert len(watch.laps) == 3 and watch.median_s > 0
    with pytest.raises(ValueError, match="repeats"):
        measure(lambda: None, "cpu", repeats=0)
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert format_cell(0.0123, "ms") == "12.3" and format_cell(0.5, "pct") == "50 %"
    assert format_cell(None, "{:.2f}") == "–"
