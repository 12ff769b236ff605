"""TokenMasks: every state's allowed-token mask equals [δ(s, v) live] from the dense table,
precomputed or built per state, over tokens and over letters."""

import numpy as np
import pytest
from helpers import random_dfa, random_letter_dfa

from ctrlg.dfa.masks import TokenMasks
from ctrlg.errors import ConstraintError


@pytest.mark.parametrize("make", [random_dfa, random_letter_dfa])
@pytest.mark.parametrize("table_bytes", [0, 1 << 20])
def test_masks_match_the_dense_table(make, table_bytes):
    for seed in range(5):
        d = make(7, 11, seed)
        live = d.live_states()
        expected = live[d.dense()]
        masks = TokenMasks(d, max_table_bytes=table_bytes, max_cached_states=3)
        assert (masks.table is None) == (table_bytes == 0)
        for _ in range(2):              # second pass: from the cache or the table
            for s in range(d.num_states):
                m = masks(s)
                assert m.dtype == bool and np.array_equal(m, expected[s])
                assert not m.flags.writeable


def test_mask_of_a_bad_state_is_a_clear_error():
    with pytest.raises(ConstraintError, match="out of range"):
        TokenMasks(random_dfa(3, 4, 0), max_table_bytes=0)(3)
