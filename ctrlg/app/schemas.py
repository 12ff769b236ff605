"""The JSON API's request and response bodies (pydantic; they make the OpenAPI schema).

Input sizes are bounded here, so an over-long or malformed body is rejected (HTTP 422) before it
reaches the model. Unknown fields are rejected too: nothing in a request names a file or a model.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["GenerateRequest", "Candidate", "GenerateResponse", "ErrorResponse", "Progress",
           "MAX_TEXT_CHARS", "MAX_PHRASES", "MAX_BANNED", "MAX_PHRASE_CHARS", "MAX_WORDS",
           "MAX_CANDIDATES", "MAX_NEW_TOKENS"]

MAX_TEXT_CHARS = 20_000      # prefix and suffix, each
MAX_PHRASES = 5              # keyphrases per request
MAX_BANNED = 12              # banned words per request
MAX_PHRASE_CHARS = 64        # per keyphrase / banned word
MAX_WORDS = 100              # word-range bounds
MAX_CANDIDATES = 8
MAX_NEW_TOKENS = 128

Phrase = Annotated[str, Field(min_length=1, max_length=MAX_PHRASE_CHARS)]


class GenerateRequest(BaseModel):
    """Generate the text between ``prefix`` and ``suffix`` (empty suffix: a continuation)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prefix: str = Field("", max_length=MAX_TEXT_CHARS, description="document text before the cursor / selection")
    suffix: str = Field("", max_length=MAX_TEXT_CHARS, description="document text after it (insertion); '' continues")
    keyphrases: list[Phrase] = Field(default_factory=list, max_length=MAX_PHRASES,
                                     description="each must appear, as whole words")
    banned: list[Phrase] = Field(default_factory=list, max_length=MAX_BANNED,
                                 description="words or phrases that must not appear as whole words (first letter in either case)")
    min_words: int | None = Field(None, ge=0, le=MAX_WORDS, description="at least this many words")
    max_words: int | None = Field(None, ge=1, le=MAX_WORDS,
                                  description="at most this many words (≥ 1: a text of no words "
                                              "is no candidate)")
    allow_newlines: bool = Field(True, description="false: the text may not contain a line break")
    num_candidates: int = Field(4, ge=1, le=MAX_CANDIDATES, description="samples drawn; distinct ones are returned")
    max_new_tokens: int = Field(32, ge=1, le=MAX_NEW_TOKENS, description="token budget of the generated text")
    mode: Literal["ctrlg", "logical"] = Field(
        "ctrlg", description="'ctrlg': HMM guidance; 'logical': only infeasible tokens are masked")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="sampling seed (same seed, same candidates)")
    request_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$",
                                   description="client-chosen id for /api/progress and /api/cancel")

    @field_validator("keyphrases", "banned")
    @classmethod
    def _not_blank(cls, phrases: list[str], info):
        """A blank entry would be dropped and the request served without it: refuse it."""
        for i, phrase in enumerate(phrases):
            if not phrase.strip():
                raise ValueError(f"{info.field_name}[{i}] is blank ({phrase!r}); give a word or "
                                 "phrase, or leave the entry out")
        return phrases

    @model_validator(mode="after")
    def _word_range(self):
        if self.min_words is not None and self.max_words is not None \
                and self.min_words > self.max_words:
            raise ValueError(f"the word range is empty: min_words={self.min_words} > "
                             f"max_words={self.max_words}")
        return self


class Candidate(BaseModel):
    text: str = Field(description="exactly what goes between prefix and suffix")
    log_likelihood: float | None = Field(
        description="log p_lm(text ⊕ suffix | prefix) in nats (the suffix truncated as the model saw it)")


class GenerateResponse(BaseModel):
    candidates: list[Candidate] = Field(description="distinct accepted samples, best first")
    seconds: float = Field(description="wall time of the request on the server")
    request_id: str


class ErrorResponse(BaseModel):
    error: str


class Progress(BaseModel):
    request_id: str
    state: Literal["queued", "building", "generating", "done", "cancelled", "failed"]
    tokens: int = Field(description="tokens generated so far (per candidate)")
    max_new_tokens: int
