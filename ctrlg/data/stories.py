"""The story corpus of the infilling and editing tasks, with its fixed split.

The bundled LAMBADA passages (narrative fiction from BookCorpus-style novels, ≈ 59 words each,
CC BY 4.0; :mod:`ctrlg.data.lambada`) stand in for ROCStories, which is not available offline.
They are split **by index, once for every story task**:

* ``train`` — passages 0–3999: anything may be trained on them (LM adapters, the HMMs' samples,
  the supervised infilling baseline, mask calibration for training);
* ``eval`` — passages 4000–5152: evaluation only. Nothing trained may see them.

``tune`` names the last :data:`TUNE_PASSAGES` passages of ``train``: the story adapters hold them
out (their held-out NLL) and the story tasks choose decoding settings on them, never on ``eval``.

LAMBADA's passages are windows of novels, and some windows overlap: 24 pairs of an evaluation and
a training passage (23 training passages) share a run of 12 words or more (e.g. passages 2678 and 4303, one continuing
the other). The training split therefore leaves out every passage that shares a 12-word run
(:data:`SHINGLE_WORDS`, after :func:`normalise`) with any evaluation passage: 3,977 of the 4,000
remain (:func:`leaking_train_indices`). :func:`check_disjoint` is the check that training text
holds no 12-word run of an evaluation passage; the story tasks run it on what they train on.
:func:`normalise` is the text identity: case-folded, typographic quotes and dashes mapped to
ASCII, whitespace collapsed.

A user's own file (``path=``) is read whole as evaluation data: the split applies to the bundled
corpus only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ctrlg.data._files import DatasetError, bundled_path, read_jsonl

__all__ = ["SPLITS", "TRAIN_RANGE", "EVAL_RANGE", "SHINGLE_WORDS", "TUNE_PASSAGES", "Story", "load_stories",
           "normalise", "shingles", "leaking_train_indices", "check_disjoint"]

TRAIN_RANGE = range(0, 4000)
EVAL_RANGE = range(4000, 5153)
SPLITS = {"train": TRAIN_RANGE, "eval": EVAL_RANGE}
SHINGLE_WORDS = 12
TUNE_PASSAGES = 200

_QUOTES = str.maketrans({"“": '"', "”": '"', "„": '"', "‘": "'", "’": "'", "‚": "'",
                         "—": "-", "–": "-", "…": "..."})


@dataclass(frozen=True)
class Story:
    """One passage: its ``index`` in the source file and its ``text`` (stripped)."""

    index: int
    text: str


def normalise(text: str) -> str:
    """The text identity of the split check (module docstring)."""
    return " ".join(text.translate(_QUOTES).casefold().split())


def shingles(text: str, words: int = SHINGLE_WORDS) -> set[str]:
    """The runs of ``words`` consecutive words of the normalised text (the whole text when
    shorter)."""
    tokens = normalise(text).split()
    if len(tokens) <= words:
        return {" ".join(tokens)} if tokens else set()
    return {" ".join(tokens[i:i + words]) for i in range(len(tokens) - words + 1)}


_LEAKING: dict = {}


def leaking_train_indices(path=None) -> frozenset[int]:
    """Indices of training-split passages that share a 12-word run with an evaluation passage."""
    key = str(path)
    if key not in _LEAKING:
        texts = _read(path)
        evaluation = set().union(*(shingles(texts[i]) for i in EVAL_RANGE if i < len(texts)))
        _LEAKING[key] = frozenset(i for i in TRAIN_RANGE if i < len(texts)
                                  and shingles(texts[i]) & evaluation)
    return _LEAKING[key]


def _read(path) -> list[str]:
    source = bundled_path("lambada_test.jsonl") if path is None else path
    texts = []
    for number, row in enumerate(read_jsonl(source)):
        text = row.get("text")
        if not isinstance(text, str):
            raise DatasetError(f"{source}: passage {number} has no string 'text' field: {row!r:.200}")
        texts.append(text.strip())
    return texts


def load_stories(split: str = "eval", path=None, *, offset: int = 0,
                 limit: int | None = None) -> list[Story]:
    """Passages ``offset`` … ``offset + limit − 1`` of ``split`` (``"train"`` | ``"tune"`` |
    ``"eval"``) of the
    bundled corpus, or of the JSONL file ``path`` (rows ``{"text": …}``; read whole, ``split``
    ignored). Empty passages are refused with a :class:`DatasetError` that names them."""
    if split not in (*SPLITS, "tune"):
        raise DatasetError(f"split must be one of {sorted(SPLITS) + ['tune']}, got {split!r}")
    if offset < 0 or (limit is not None and limit < 0):
        raise DatasetError(f"offset and limit must be >= 0, got offset={offset}, limit={limit}")
    texts = _read(path)
    if path is not None:
        indices = list(range(len(texts)))
    else:
        leaking = leaking_train_indices() if split != "eval" else frozenset()
        indices = [i for i in SPLITS["eval" if split == "eval" else "train"]
                   if i < len(texts) and i not in leaking]
        if split == "tune":
            indices = indices[-TUNE_PASSAGES:]
    end = None if limit is None else offset + limit
    stories = [Story(i, texts[i]) for i in indices[offset:end]]
    for story in stories:
        if not story.text:
            raise DatasetError(f"passage {story.index} of {path or 'the bundled corpus'} is empty")
    return stories


def check_disjoint(train_texts: Iterable[str], eval_texts: Sequence[str], what: str = "") -> None:
    """DatasetError when the training texts hold a 12-word run (normalised) of an evaluation text,
    or a whole evaluation text shorter than that."""
    seen: set[str] = set()
    for text in train_texts:
        seen |= shingles(text)
    for text in eval_texts:
        if shingles(text) & seen:
            raise DatasetError(f"evaluation passage {text[:60]!r}… overlaps the training data"
                               f"{' of ' + what if what else ''} (a run of {SHINGLE_WORDS} words)")
