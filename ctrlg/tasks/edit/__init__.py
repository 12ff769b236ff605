"""Interactive text editing as Ctrl-G measured it (§5, Table 3): examples cut from real passages
(:mod:`.examples`), the methods (:mod:`.methods`: Ctrl-G, logical masking, constraints stated in
the prompt) and the scores (:mod:`.scoring`: success, reference overlap, fluency, coherence,
repetition, overall satisfaction). The editor (:mod:`ctrlg.app`) serves the same LM, HMM and
constraint.

May import what :mod:`ctrlg.tasks` may.
"""
