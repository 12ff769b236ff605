"""Example documents for the editor: the CoAuthor writing prompts (Lee et al., CHI 2022; MIT),
bundled as ``ctrlg/data/bundled/coauthor.prompts.tsv`` with ``LICENSE.coauthor``."""

from __future__ import annotations

import csv
from functools import lru_cache

from ctrlg.data._files import bundled_path

__all__ = ["load_examples"]


@lru_cache(maxsize=1)
def load_examples() -> tuple[dict, ...]:
    """``({"domain", "code", "text"}, ...)``; a blank domain continues the one above and ``\\n``
    escapes in the prompt become newlines."""
    rows = []
    domain = ""
    with bundled_path("coauthor.prompts.tsv").open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE):
            domain = (row.get("domain") or "").strip() or domain
            text = (row.get("prompt") or "").replace("\\n", "\n").strip()
            if text:
                rows.append({"domain": domain, "code": row["prompt_code"].strip(), "text": text})
    return tuple(rows)
