"""Text infilling (Ctrl-G §4.2, after ILM): the constraint that keeps a masked passage's fragments
(:mod:`.constraint`), the ILM-style baseline's decoding (:mod:`.ilm_decoding`) and the benchmark's
masks, methods and scores (:mod:`.pipeline`). Shares the story LMs' formats and adaptation with
:mod:`ctrlg.tasks.stories`.

May import what :mod:`ctrlg.tasks` may.
"""
