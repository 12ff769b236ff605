"""The interactive editor: Ctrl-G's text-editing application as a local web app.

``python -m ctrlg.app`` serves it on the embedded SmolLM2 + HMM (see docs/app.md);
:func:`create_app` builds the FastAPI application around any LM / tokenizer / HMM.

Modules: :mod:`~ctrlg.dfa.edit_constraint` (request → token DFA), :mod:`~ctrlg.app.service`
(queueing, time budget, cancellation, text ↔ tokens), :mod:`~ctrlg.app.schemas` (the JSON API),
:mod:`~ctrlg.app.server` (routes), :mod:`~ctrlg.app.examples` (CoAuthor example documents).

May import every library package it serves (dfa, hmm, lm, sampler, data, vocab, validation,
errors); not :mod:`ctrlg.tasks`, and nothing imports it.
"""

from ctrlg.app.service import EditorService, Limits
from ctrlg.app.server import create_app

__all__ = ["create_app", "EditorService", "Limits"]
