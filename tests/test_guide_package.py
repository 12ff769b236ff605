"""The guide's package: its modules live only in ctrlg.guide (no top-level re-exports), every
constraint reaches the processor through one mask interface, and per-row mask cursors follow beam
reorderings."""

import importlib

import numpy as np
import pytest
import torch

import ctrlg.guide
from ctrlg.dfa.core import TokenDFA
from ctrlg.guide.feasibility import Feasibility
from ctrlg.guide.masks import DFAMask, TokenMask, regular_automaton, token_mask
from ctrlg.guide.row_state import RowStates
from helpers import random_dfa

OLD_MODULES = ["feasibility", "token_weights", "canonical_masks", "guidance", "row_state", "priors"]


@pytest.mark.parametrize("name", OLD_MODULES)
def test_guide_modules_live_only_in_the_guide_package(name):
    """The former top-level re-export shims are gone: ctrlg.<name> no longer imports, and
    ctrlg.guide.<name> exports what it says."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"ctrlg.{name}")
    new = importlib.import_module(f"ctrlg.guide.{name}")
    assert new.__all__ and all(hasattr(new, member) for member in new.__all__)


def test_ctrlg_guide_keeps_the_former_module_exports():
    tables = importlib.import_module("ctrlg.guide.tables")
    for member in tables.__all__ + ["BLOCK_LETTER", "PRECISIONS"]:
        assert getattr(ctrlg.guide, member) is getattr(tables, member), member


def test_a_token_dfa_is_its_own_exact_mask():
    d = random_dfa(5, 4, 0)
    table = Feasibility(d, 3, eos_token_id=3)
    mask = token_mask(d, table)
    assert isinstance(mask, DFAMask) and isinstance(mask, TokenMask) and not mask.refines
    assert regular_automaton(d) is d
    for s in range(d.num_states):
        for r in (1, 2, 3):
            np.testing.assert_array_equal(mask.allowed(None, s, r),
                                          table.token_feasible([s], [r]).numpy()[0])


class _HistoryMask:
    """A refining mask whose cursor is the token history: the bookkeeping must hand every row
    exactly its own generated tokens, whatever the reordering."""

    refines = True

    def __init__(self, table):
        self.table = table

    def start(self):
        return ()

    def advance(self, cursor, token):
        return cursor + (int(token),)


def test_row_cursors_follow_reordering_and_duplication():
    V, B = 5, 6
    dfas: list[TokenDFA] = [random_dfa(4, V, 1), random_dfa(3, V, 2)]
    masks = [_HistoryMask(None), None]          # DFA 1 keeps no cursor
    rows = RowStates(dfas, None, masks)
    rng = np.random.default_rng(0)
    dfa_index = torch.tensor([0, 0, 0, 1, 1, 1])
    generated = torch.zeros(B, 0, dtype=torch.long)
    for step in range(6):
        rows.update(generated, dfa_index)
        for i in range(B):
            want = tuple(generated[i].tolist()) if int(dfa_index[i]) == 0 else None
            assert rows.cursors[i] == want
        parents = torch.arange(B) if step % 2 else torch.tensor(
            [int(rng.integers(0, 3)) for _ in range(3)] + [int(rng.integers(3, 6)) for _ in range(3)])
        generated = torch.cat([generated[parents], torch.tensor(rng.integers(0, V, size=(B, 1)))], 1)
    # a fresh call with no parent replays every cursor from the start
    rows.reset()
    rows.update(generated, dfa_index)
    assert rows.cursors[0] == tuple(generated[0].tolist())
