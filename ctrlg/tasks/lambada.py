"""LAMBADA as a ReLM query (Kuchnik et al. 2023, §4.4): the passage's last word, predicted by
greedy decoding (the baseline) or as the most likely match of a query over the LM — ``words``
(a space and letters), ``terminated`` (then a terminator, so the word is complete) or ``no_stop``
(terminated, and not an English stop word) — found by shortest-path search
(:func:`ctrlg.relm.search`).

May import: :mod:`ctrlg.relm`, :mod:`ctrlg.validation`.
"""

from __future__ import annotations

import re

import torch

from ctrlg.relm import Query, exclude_words, search
from ctrlg.tasks.record_files import RecordSchema, missing_seconds
from ctrlg.validation import check_context_length

__all__ = ["STOP_WORDS", "first_word", "lambada_query", "lambada_record_schema", "predict_baseline",
           "predict_query"]


#: English stop words (the NLTK list), used by the ``no_stop`` variant.
STOP_WORDS = tuple("""i me my myself we our ours ourselves you you're you've you'll you'd your yours
yourself yourselves he him his himself she she's her hers herself it it's its itself they them their
theirs themselves what which who whom this that that'll these those am is are was were be been
being have has had having do does did doing a an the and but if or because as until while of at by
for with about against between into through during before after above below to from up down in out
on off over under again further then once here there when where why how all any both each few more
most other some such no nor not only own same so than too very s t can will just don don't should
should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn doesn't hadn hadn't
hasn hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan shan't
shouldn shouldn't wasn wasn't weren weren't won won't wouldn wouldn't""".split())

_TERMINATORS = r"[.,!?;:'\" \n]"


def first_word(text: str) -> str:
    """The first run of letters/apostrophes/hyphens in ``text`` ("" when none)."""
    match = re.search(r"[A-Za-z][A-Za-z'\-]*", text)
    return match.group(0) if match else ""


def lambada_query(variant: str, max_tokens: int, top_k: int | None = None,
                  encodings: str = "all"):
    if variant == "words":
        return Query(pattern=r" [A-Za-z]+", max_tokens=max_tokens, top_k=top_k,
                     encodings=encodings)
    terminated = Query(pattern=rf" [A-Za-z]+{_TERMINATORS}", max_tokens=max_tokens + 1,
                       top_k=top_k, encodings=encodings)
    if variant == "terminated":
        return terminated
    if variant == "no_stop":
        return Query(pattern=terminated.pattern, max_tokens=terminated.max_tokens, top_k=top_k,
                     encodings=encodings, filters=(exclude_words(STOP_WORDS),))
    raise ValueError(f"unknown LAMBADA variant {variant!r}; choose from baseline, words, "
                     f"terminated, no_stop")


@torch.no_grad()
def predict_baseline(model, tokenizer, context_ids: list[int], max_tokens: int) -> str:
    check_context_length(model, len(context_ids), max_tokens, what="the passage")
    ids = torch.tensor([context_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_tokens, pad_token_id=tokenizer.eos_token_id)
    return first_word(tokenizer.decode(out[0, len(context_ids):], skip_special_tokens=True))


def predict_query(model, tokenizer, context_ids: list[int], query, batch_size: int,
                  max_expansions: int) -> str:
    """The first word of the most likely match ("" when none is found within the search limit)."""
    for result in search(model, tokenizer, query, num_results=1, batch_size=batch_size,
                         context_ids=context_ids, max_expansions=max_expansions):
        return first_word(result.text)
    return ""


def lambada_record_schema(examples, variants) -> RecordSchema:
    """What a row of ``predictions.jsonl`` must be to be resumed: keyed by the passage's
    ``index`` (an int), the selected passage's own ``target`` (its last word: a row of another
    passage under the same index is refused), and either ``skipped`` (a reason) or every
    variant's guess (a string) with its seconds."""
    targets = {index: example.target for index, example in enumerate(examples)}

    def check(row: dict) -> str | None:
        if row["index"] in targets and row["target"] != targets[row["index"]]:
            return (f"its target {row['target']!r} is not passage {row['index']}'s "
                    f"{targets[row['index']]!r} (another data file?)")
        if "skipped" in row:
            return None if isinstance(row["skipped"], str) else "'skipped' is not a reason"
        missing = [v for v in variants if not isinstance(row.get(v), str)]
        if missing:
            return f"no guess (a string) of {', '.join(missing)}"
        return missing_seconds(row, variants)

    return RecordSchema(fields={"index": int, "target": str}, check=check)
