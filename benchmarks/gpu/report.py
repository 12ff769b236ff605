"""Writing the benchmark results: one JSON file and one markdown file per device.

``benchmarks/results/gpu_<device-slug>.json`` holds everything (meta: device name, peak table
entry, versions, command; one entry per section with its rows and skipped implementations);
``gpu_<device-slug>.md`` renders each section's rows as a markdown table with the columns the
section module lists in ``MARKDOWN_COLUMNS`` (``(key, header, format)``; dotted keys reach into
nested dicts, format ``"ms"`` prints seconds as milliseconds, ``"pct"`` a fraction as a percent).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

__all__ = ["device_slug", "write_results", "markdown", "format_cell"]


def device_slug(device_name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` → ``"nvidia-h100-80gb-hbm3"`` (lower case, [a-z0-9-])."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return slug or "unknown-device"


def _lookup(row: dict, dotted: str):
    value = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def format_cell(value, fmt: str) -> str:
    """One table cell (module docstring); missing values print as "–"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if fmt == "ms":
        return f"{value * 1e3:.3g}"
    if fmt == "pct":
        return f"{100 * value:.3g} %"
    return fmt.format(value)


def _table(rows: list[dict], columns: list[tuple[str, str, str]]) -> list[str]:
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(_lookup(row, k), f) for k, _, f in columns) + " |")
    return lines


def markdown(results: dict, columns: dict[str, list]) -> str:
    """The markdown report of ``results`` (see module docstring)."""
    meta = results["meta"]
    peak = meta.get("peak")
    lines = [f"# ctrlg GPU benchmarks — {meta['device_name']}", "",
             f"- device: `{meta['device']}` ({meta['device_name']}), size `{meta['size']}`, "
             f"seed {meta['seed']}, {meta['started_utc']}",
             f"- torch {meta['torch']}, triton {meta.get('triton') or '–'}, "
             f"transformers {meta['transformers']}"
             + (", Triton interpreter (TRITON_INTERPRET=1)" if meta.get("triton_interpret") else ""),
             "- peak: " + (f"{peak['name']}: bf16 {peak['bf16_flops'] / 1e12:g}, tf32 "
                           f"{peak['tf32_flops'] / 1e12:g}, fp32 {peak['fp32_flops'] / 1e12:g} "
                           f"TFLOP/s; HBM {peak['hbm_bytes_per_s'] / 1e12:g} TB/s "
                           f"({meta['peak_source']})" if peak else
                           "none for this device (fractions of peak are –)"),
             f"- command: `{meta['command']}`", ""]
    for name, section in results["sections"].items():
        lines += [f"## {name}", ""]
        if "error" in section:
            lines += [f"Failed: `{section['error']}`", ""]
            continue
        lines.append(section.get("description", ""))
        for key in ("flop_model", "byte_model", "goal", "target", "constraint", "model", "prompts"):
            if section.get(key):
                lines.append(f"- {key.replace('_', ' ')}: {section[key]}")
        lines.append("")
        lines += _table(section["rows"], columns[name]) + [""]
        for skip in section.get("skipped", []):
            what = ", ".join(f"{k}={v}" for k, v in skip.items() if k != "reason")
            lines.append(f"- skipped {what}: {skip['reason']}")
        if section.get("skipped"):
            lines.append("")
    return "\n".join(lines)


def write_results(results: dict, columns: dict[str, list], out_dir: str | Path, *,
                  merge: bool = True) -> tuple[Path, Path]:
    """Write ``gpu_<slug>.json`` and ``gpu_<slug>.md`` into ``out_dir`` (``gpu_<slug>_<size>.*``
    for sizes other than ``full``); returns both paths. With ``merge``, sections of an existing
    file for the same size that this run did not measure are kept (so sections can be measured
    by separate commands); each section records its own ``measured_utc`` and ``command``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "gpu_" + device_slug(results["meta"]["device_name"])
    if results["meta"]["size"] != "full":
        stem += "_" + results["meta"]["size"]
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    if merge and json_path.is_file():
        try:
            old = json.loads(json_path.read_text())
        except json.JSONDecodeError:
            old = {}
        if old.get("meta", {}).get("size") == results["meta"]["size"]:
            kept = {k: v for k, v in old.get("sections", {}).items() if k not in results["sections"]}
            results = dict(results, sections={**kept, **results["sections"]})
    json_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    md_path.write_text(markdown(results, columns) + "\n")
    return json_path, md_path
