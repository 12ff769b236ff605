"""docs/results.md is what ``python -m benchmarks.report`` writes from the kept runs, and every
figure README.md's results quote is on that page.

A figure is a number with a decimal point (``28.50``, ``1.4``) or a percentage (``98.4 %``,
``100 %``) in a README section whose heading names results; it must appear on docs/results.md
as the same number (a percentage: followed by ``%``), sign and thousands separators as written.
"""

import json
import re
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.demo_readme import block_hash, readme_blocks, shown_outputs

ROOT = Path(__file__).resolve().parents[1]
# a number: digits with optional thousands separators, then a decimal part or a percent sign
FIGURE = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(\s?%)?(?![\w])")
SECTION = re.compile(r"^(#{2,3}) (.*)$", re.M)


def results_sections(markdown: str) -> str:
    """The text of the sections whose heading says "results", their subsections included (up
    to the next heading of the same or a higher level), without their own heading line."""
    headings = list(SECTION.finditer(markdown))
    parts = []
    for i, heading in enumerate(headings):
        if "result" not in heading.group(2).lower():
            continue
        level = len(heading.group(1))
        end = next((h.start() for h in headings[i + 1:] if len(h.group(1)) <= level), len(markdown))
        parts.append(markdown[heading.end():end])
    return "\n".join(parts)


def figures(text: str) -> list[str]:
    """The figures of ``text`` as written: ``28.50``, ``2,016``-free integers are skipped,
    percentages keep their ``%`` (without the space)."""
    found = []
    for match in FIGURE.finditer(text):
        whole, decimals, percent = match.groups()
        if decimals or percent:
            found.append(f"{whole}{decimals or ''}{'%' if percent else ''}")
    return found


def missing_figures(readme: str, results: str) -> list[str]:
    """The figures of ``readme``'s results sections that ``results`` does not hold."""
    held = set(figures(results))
    return sorted(set(f for f in figures(results_sections(readme)) if f not in held))


def test_figures_are_numbers_with_a_decimal_point_or_a_percent_sign():
    text = "BLEU-4 28.50 at 128 beams, 2,016 (98.4 %) of 2,049; 100 % success; item 7.5x; v1.9.1"
    assert figures(text) == ["28.50", "98.4%", "100%"]
    assert figures("p50 / p99 2.6 / 230 µs, 1,234.5 ms, +7.51 [+6.05, +8.94]") == [
        "2.6", "1,234.5", "7.51", "6.05", "8.94"]


def test_only_the_results_sections_are_checked():
    readme = ("# T\n\n## Quick start\n-23.0 not a result\n\n## Results\n\n28.50 and 98.4 %\n\n"
              "### CommonGen\n15.75\n\n## Semantics\n0.5 is not checked\n")
    assert results_sections(readme).split() == ["28.50", "and", "98.4", "%", "###", "CommonGen", "15.75"]
    assert missing_figures(readme, "| 28.50 | 98.4 % |") == ["15.75"]
    assert missing_figures(readme, "28.50, 98.4%, 15.75") == []
    # the same digits are not the same figure: 28.5 is not 28.50, 98.4 without % is not 98.4 %
    assert missing_figures(readme, "28.5 98.4 15.75") == ["28.50", "98.4%"]


def test_every_figure_the_readme_quotes_is_on_the_results_page():
    readme = (ROOT / "README.md").read_text()
    assert figures(results_sections(readme)), "README.md has no results section with figures"
    missing = missing_figures(readme, (ROOT / "docs" / "results.md").read_text())
    assert not missing, (f"README.md quotes {missing}, which docs/results.md does not hold: quote "
                         "the figures of a kept run (register it in benchmarks/results/manifest.yaml)")


def test_shown_outputs_are_the_comment_lines_after_prints():
    block = ("x = 1\nprint(x)\n# prints (a note)\n# -23.0 Dogs catch.\n# ...\n# 1 2\n"
             "y = 2\n# not an output\n")
    assert shown_outputs(block) == ["-23.0 Dogs catch.", "1 2"]
    assert block_hash(block) == block_hash(block.replace("# 1 2", "# 3 4"))
    assert block_hash(block) != block_hash(block.replace("x = 1", "x = 2"))


def test_the_readme_shows_what_its_example_printed():
    """Every output a README block shows after ``# prints`` was printed by that block, as written,
    in the kept run of ``python -m benchmarks.demo_readme``."""
    kept = json.loads((ROOT / "benchmarks" / "results" / "demo_readme.json").read_text())
    blocks = readme_blocks((ROOT / "README.md").read_text())
    shown = {number: shown_outputs(block) for number, block in enumerate(blocks, 1)}
    assert any(shown.values()), "README.md shows no example output (# prints)"
    for number, lines in shown.items():
        if not lines:
            continue
        run = kept["blocks"][number - 1]
        assert run["sha256"] == block_hash(blocks[number - 1]), (
            f"README block {number} changed since it was run: run `python -m benchmarks.demo_readme`")
        missing = [line for line in lines if line not in run["printed"]]
        assert not missing, f"README block {number} shows {missing}, which it did not print"


def test_results_page_is_what_the_generator_writes(tmp_path):
    out = tmp_path / "results.md"
    report.main(["--out", str(out)])
    assert out.read_text() == (ROOT / "docs" / "results.md").read_text(), (
        "docs/results.md is stale: run `python -m benchmarks.report`")


# ------------------------------------------------------------------ the generator on a toy manifest
def _manifest(tmp_path, entries) -> list:
    path = tmp_path / "manifest.yaml"
    path.write_text(json.dumps({"sections": [{"title": "Toy", "entries": entries}]}))
    return report.load_manifest(path)


def _entry(**fields) -> dict:
    return {"id": "toy", "title": "a toy", "machine": "a laptop", "command": "python -m toy",
            **fields}


def test_a_table_entry_names_its_run_machine_and_command(tmp_path):
    (tmp_path / "toy.json").write_text(json.dumps({"rows": [{"m": "a", "x": 1234.567},
                                                            {"m": "b", "x": -0.5}]}))
    sections = _manifest(tmp_path, [_entry(kind="table", source="toy.json",
                                           columns=[["method", "{{ row.m }}"],
                                                    ["x", "{{ row.x | num(1) }}"]])])
    page = report.render(sections, root=tmp_path)
    assert "| method | x |\n|---|---|\n| a | 1,234.6 |\n| b | \u22120.5 |" in page
    assert "Run: `benchmarks/results/toy.json` · machine: a laptop · command: `python -m toy`" in page


def test_a_figure_entry_is_a_row_of_its_sections_table(tmp_path):
    (tmp_path / "toy.json").write_text(json.dumps({"states": 1501, "s": 0.0690}))
    sections = _manifest(tmp_path, [_entry(kind="figure", source="toy.json",
                                           figure="{{ r.states | num(0) }} states in {{ r.s | num(2) }} s")])
    page = report.render(sections, root=tmp_path)
    assert ("| a toy | 1,501 states in 0.07 s | `benchmarks/results/toy.json` | a laptop | "
            "`python -m toy` |") in page


def test_an_entry_whose_run_has_not_landed_is_listed_not_rendered(tmp_path):
    sections = _manifest(tmp_path, [_entry(kind="table", source="infill/eval/metrics.json",
                                           columns=[["x", "{{ row.x }}"]])])
    page = report.render(sections, root=tmp_path)
    assert "## Toy" not in page
    assert "## Registered runs not kept yet" in page
    assert "`benchmarks/results/infill/eval/metrics.json`" in page


def test_a_commongen_entry_renders_its_stored_scores(tmp_path):
    run = tmp_path / "commongen" / "run"
    run.mkdir(parents=True)
    entry = _entry(kind="commongen", runs=["commongen/run"], ranges=["0:2"], baseline="logical")
    sections = _manifest(tmp_path, [entry])
    assert "*Not scored yet: `python -m benchmarks.score_commongen toy`" in report.render(sections, root=tmp_path)
    row = {"bleu4": 20.0, "rouge_l": 50.0, "cider": 14.0, "meteor": None, "success": 100.0, "words": 9.0}
    ci = {"delta": 20.0, "low": 15.5, "high": 24.25}
    (run / report.SCORES_FILE).write_text(json.dumps({"toy": {
        "baseline": "logical", "command": "python -m benchmarks.score_commongen toy",
        "report": {"0:2": {"items": 2, "reference_words": 10.0,
                           "methods": {"logical": {**row, "bleu4": 0.0}, "ctrlg": row},
                           "intervals": {"ctrlg": {"bleu4": ci, "rouge_l": ci, "cider": ci}}}}}}))
    page = report.render(sections, root=tmp_path)
    assert "| items | method | BLEU-4 | ROUGE-L | CIDEr | success % | words (references) |" in page
    assert "| 0–1 (2) | `ctrlg` | 20.00 | 50.00 | 14.00 | 100.0 | 9.0 (10.0) |" in page
    assert "| 0–1 (2) | `ctrlg` − `logical` | +20.00 [+15.50, +24.25] |" in page


@pytest.mark.parametrize("fields, message", [
    ({"kind": "table", "source": "toy.json", "columns": [["x", "{{ row.nope }}"]]}, "row.nope"),
    ({"kind": "chart", "source": "toy.json"}, "kind 'chart'"),
    ({"kind": "figure", "source": "toy.json"}, "needs ['figure']"),
])
def test_a_bad_entry_is_an_error_that_names_it(tmp_path, fields, message):
    (tmp_path / "toy.json").write_text(json.dumps({"rows": [{"x": 1}]}))
    with pytest.raises(report.ReportError, match="toy") as error:
        report.render(_manifest(tmp_path, [_entry(**fields)]), root=tmp_path)
    assert message in str(error.value)
