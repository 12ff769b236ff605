"""What the story tasks (text infilling, :mod:`ctrlg.tasks.infill`; interactive editing,
:mod:`ctrlg.tasks.edit`) share, beside the corpus and its split (:mod:`ctrlg.data.stories`) and the story LMs' text formats
(:mod:`ctrlg.data.story_prompts`): ILM's infilling format for the supervised baseline (:mod:`.ilm`)
and the LoRA adaptation recipe (:mod:`.adaptation`).

May import: :mod:`ctrlg.data`, :mod:`ctrlg.lm`, :mod:`ctrlg.errors`, :mod:`ctrlg.validation`.
"""
