"""Bad and edge-case inputs: each gets a clear ctrlg error (a ValueError naming the input and the
fix), never a silent wrong answer, a hang, or a lost/mixed checkpoint. docs/errors.md lists them."""

import json
import os
import re
from pathlib import Path
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import ctrlg
from ctrlg import dfa
from dfa_strategies import all_sequences, language, token_dfas
from test_relm import lm, tok  # noqa: F401  (fixtures: a tiny Llama over the SmolLM2 tokenizer)

from ctrlg.errors import (CheckpointError, ConstraintError, CtrlgError,
                          UnsatisfiableConstraintError, VocabularyMismatchError)


def small_hmm(h=3, V=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ctrlg.HMM.from_params(torch.rand(h, generator=g) + 0.1,
                                 torch.rand(h, h, generator=g) + 0.1,
                                 torch.rand(h, V, generator=g) + 0.1, normalize=True)


# ---------------------------------------------------------------------- HMM entry points
@pytest.mark.parametrize("args", [(-1, 4), (2, -1), (1.5, 2), ("3", 2), (True, 2)])
def test_hmm_sample_rejects_bad_counts(args):
    with pytest.raises(ConstraintError, match="num_samples|length"):
        small_hmm().sample(*args)


def test_hmm_sample_zero_rows_is_empty():
    assert small_hmm().sample(0, 3).shape == (0, 3)


@pytest.mark.parametrize("ids", [torch.tensor([[1.5, 2.0]]), [[1.0, 2.0]], torch.tensor([[True]])])
def test_hmm_log_prob_rejects_non_integer_ids(ids):
    with pytest.raises(ConstraintError, match="integer token ids"):
        small_hmm().log_prob(ids)


def test_hmm_log_prob_rejects_a_bad_mask():
    with pytest.raises(ConstraintError, match="mask must be a bool tensor"):
        small_hmm().log_prob([[1, 2]], mask=torch.ones(1, 3, dtype=torch.bool))


def test_hmm_load_rejects_a_config_that_is_a_json_list(tmp_path):
    path = small_hmm().save(tmp_path / "h")
    (path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="JSON object"):
        ctrlg.HMM.load(path)


def test_hmm_save_is_atomic_when_it_fails_half_way(tmp_path, monkeypatch):
    """A save that dies after writing the weights leaves the previous checkpoint intact."""
    old, new = small_hmm(seed=1), small_hmm(seed=2)
    old.config["tokenizer_hash"] = "old-hash"
    new.config["tokenizer_hash"] = "new-hash"
    path = old.save(tmp_path / "h")

    def broken_dumps(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dumps", broken_dumps)
    with pytest.raises(OSError, match=f"saving {re.escape(str(path))} failed: disk full"):
        new.save(path)
    monkeypatch.undo()
    loaded = ctrlg.HMM.load(path)
    assert loaded.config["tokenizer_hash"] == "old-hash"
    assert torch.allclose(loaded.emission, old.emission)
    assert [p.name for p in tmp_path.iterdir()] == ["h"]       # no staging folder left behind


@pytest.mark.parametrize("where", ["/proc/ctrlg_hmm", "under_a_file"])
def test_hmm_save_to_an_unwritable_place_names_the_users_path(tmp_path, where):
    """It raised a bare FileNotFoundError naming an internal staging folder."""
    from ctrlg.errors import CheckpointWriteError

    if where == "under_a_file":
        (tmp_path / "notes.txt").write_text("a file, not a folder")
        where = str(tmp_path / "notes.txt" / "hmm")
    elif not Path("/proc").is_dir():
        pytest.skip("no /proc on this system")
    with pytest.raises(CheckpointWriteError, match=f"cannot save to {re.escape(where)}") as caught:
        small_hmm().save(where)
    assert ".staging-" not in str(caught.value) and isinstance(caught.value, OSError)
    assert caught.value.__suppress_context__                # no internal traceback behind it


def test_hmm_load_rejects_files_of_two_different_saves(tmp_path):
    a = small_hmm(seed=1).save(tmp_path / "a")
    b = small_hmm(seed=2).save(tmp_path / "b")
    (b / "config.json").write_text((a / "config.json").read_text())
    with pytest.raises(CheckpointError, match="mixes files of different saves"):
        ctrlg.HMM.load(b)


def test_hmm_resave_keeps_foreign_files_and_replaces_its_own(tmp_path):
    path = small_hmm(seed=1).save(tmp_path / "h")
    (path / "NOTES.txt").write_text("mine")
    (path / "prior_head.json").write_text("{}")        # a companion file the new save lacks
    small_hmm(seed=2).save(path)
    assert (path / "NOTES.txt").read_text() == "mine"
    assert not (path / "prior_head.json").exists()
    assert torch.allclose(ctrlg.HMM.load(path).emission, small_hmm(seed=2).emission)


def test_stale_staging_folders_of_dead_processes_are_removed(tmp_path):
    from ctrlg.checkpoint import remove_stale_staging, staging_folder

    alive = staging_folder(tmp_path / "h")           # ours, in progress: kept
    dead = tmp_path / ".h.staging-999999999-abc"     # a killed writer (no such pid)
    dead.mkdir()
    assert remove_stale_staging(tmp_path, "h") == [dead]
    assert alive.exists() and not dead.exists()
    dead.mkdir()
    small_hmm().save(tmp_path / "h")                 # every save cleans up first
    assert not dead.exists()


# ---------------------------------------------------------------------- model loading
def test_unknown_hub_id_fails_fast_when_the_hub_cannot_be_reached(monkeypatch):
    from huggingface_hub import constants

    from ctrlg.lm.models import ModelLoadError, load_model, load_tokenizer

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")   # nothing listens there
    for load in (load_tokenizer, load_model):
        start = time.perf_counter()
        with pytest.raises(ModelLoadError, match="not in the Hugging Face cache"):
            load("some/unknown-model")
        assert time.perf_counter() - start < 10


def test_unknown_hub_id_offline_names_the_fix(monkeypatch):
    from ctrlg.lm.models import ModelLoadError, load_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE"):
        load_tokenizer("some/unknown-model")


def test_folder_without_a_tokenizer_is_a_clear_error(tmp_path):
    from ctrlg.lm.models import ModelLoadError, load_tokenizer

    with pytest.raises(ModelLoadError, match="has no tokenizer"):
        load_tokenizer(tmp_path)


def test_model_config_that_is_a_json_list_is_a_clear_error(tmp_path):
    from ctrlg.lm.models import ModelLoadError, load_model, load_tokenizer

    (tmp_path / "config.json").write_text("[1, 2]")
    (tmp_path / "tokenizer.json").write_text("{}")
    for load in (load_model, load_tokenizer):
        with pytest.raises(ModelLoadError, match="JSON object"):
            load(tmp_path)


def test_stale_conversion_staging_folders_are_removed_by_later_runs(tmp_path, monkeypatch):
    from ctrlg.lm.models import EMBEDDED_NAME, resolve_model_dir

    monkeypatch.setenv("CTRLG_CACHE", str(tmp_path))
    target = tmp_path / EMBEDDED_NAME
    target.mkdir()
    (target / "config.json").write_text("{}")
    killed = tmp_path / f".{EMBEDDED_NAME}.staging-999999999-x1y2"   # writer pid gone
    legacy = tmp_path / f"{EMBEDDED_NAME}.ab12cd34"                  # older naming, a day old
    for folder in (killed, legacy):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"partial")
    os.utime(legacy, (time.time() - 3 * 86400,) * 2)
    assert resolve_model_dir(None) == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [EMBEDDED_NAME]


# ---------------------------------------------------------------------- ReLM
@pytest.mark.parametrize("kwargs", [dict(num_results=0), dict(num_results=-2),
                                    dict(num_results=1.5), dict(batch_size=0)])
def test_relm_search_rejects_bad_counts_before_searching(lm, tok, kwargs):
    from ctrlg.relm import Query, search

    with pytest.raises(ConstraintError, match="num_results|batch_size"):
        list(search(lm, tok, Query("cat|dog", max_tokens=2), **kwargs))


@pytest.mark.parametrize("encodings", ["all", "canonical"])
def test_relm_query_longer_than_its_budget_fails_at_once(lm, tok, encodings):
    from ctrlg.relm import Query, sample, search

    query = Query("[a-z]{200}", max_tokens=4, encodings=encodings)
    start = time.perf_counter()
    with pytest.raises(UnsatisfiableConstraintError, match="max_tokens=4.*at least"):
        list(search(lm, tok, query, num_results=1))
    with pytest.raises(UnsatisfiableConstraintError, match="max_tokens=4"):
        sample(lm, tok, query, num_samples=1)
    assert time.perf_counter() - start < 5


def test_relm_exact_token_budget_check_after_compiling(lm, tok):
    """The byte bound passes (a 6-letter match might be one token) but no token matches."""
    from ctrlg.relm import Query, search

    with pytest.raises(UnsatisfiableConstraintError, match="shortest token encoding"):
        search(lm, tok, Query("[a-z]{4}qz", max_tokens=1, encodings="all"))


# ---------------------------------------------------------------------- DFA builders and ops
def _best_time(build, repeats=2):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        build()
        best = min(best, time.perf_counter() - start)
    return best


def test_word_count_beyond_the_supported_bound_fails_at_once(smollm2_tokenizer):
    start = time.perf_counter()
    with pytest.raises(ConstraintError, match="max_words=1000000 is above the supported word bound"):
        dfa.word_count(0, 10**6, smollm2_tokenizer)
    with pytest.raises(ConstraintError, match="min_words"):
        dfa.commongen_constraint("dog_N", smollm2_tokenizer, min_words=10**6)
    assert time.perf_counter() - start < 10          # it ran > 100 s before the bound


@pytest.mark.parametrize("build", ["word_count", "intersect_length"])
def test_counter_automata_build_in_near_linear_time(smollm2_tokenizer, build):
    """Quadrupling the counter must cost well under the 16× of a quadratic builder (Moore's
    refinement needed one O(S·C) round per count; the product search merged sorted sets per
    BFS level). A time ratio within one process is robust to the machine's load."""
    V = len(smollm2_tokenizer)
    make = {"word_count": lambda n: dfa.word_count(0, n, smollm2_tokenizer),
            "intersect_length": lambda n: dfa.intersect(dfa.length(0, n, vocab_size=V),
                                                        dfa.phrase([3, 4], V))}[build]
    make(10)                                                   # warm caches
    small, large = _best_time(lambda: make(1000)), _best_time(lambda: make(4000))
    assert large / small < 10, (small, large)


def test_counter_automata_stay_exact_after_the_fast_minimisation():
    V = 3
    d = dfa.intersect(dfa.length(2, 300, vocab_size=V), dfa.phrase([1, 2], V))
    for n in (0, 1, 2, 3, 299, 300, 301):
        for seq in ([0] * n, ([1, 2] + [0] * n)[:n], ([0] * n + [1, 2])[-n:] if n else []):
            expect = 2 <= len(seq) <= 300 and any(seq[i:i + 2] == [1, 2] for i in range(len(seq)))
            assert d.accepts(seq) == expect, seq


@settings(max_examples=200, deadline=None)
@given(table=st.integers(1, 9).flatmap(lambda S: st.lists(
           st.lists(st.integers(0, S - 1), min_size=3, max_size=3), min_size=S, max_size=S)),
       data=st.data())
def test_hopcroft_from_any_moore_round_gives_the_moore_partition(table, data):
    from ctrlg.dfa.minimize import moore_partition

    table = np.array(table)
    accepting = np.array(data.draw(st.lists(st.booleans(), min_size=len(table),
                                            max_size=len(table))))
    def canonical(block):
        first: dict = {}
        return [first.setdefault(b, len(first)) for b in block.tolist()]
    reference = canonical(moore_partition(table, accepting, max_rounds=None))
    for rounds in (0, 1, 2):
        assert canonical(moore_partition(table, accepting, max_rounds=rounds)) == reference


@settings(max_examples=150, deadline=None)
@given(d=token_dfas(max_states=6), budget=st.integers(0, 4))
def test_restrict_to_budget_keeps_the_language_up_to_the_budget(d, budget):
    from ctrlg.dfa.ops import min_tokens_to_accept, restrict_to_budget

    full = language(d, budget)
    shortest = min_tokens_to_accept(d)
    lengths = [len(x) for x in all_sequences(d.vocab_size, budget)]
    expect_shortest = min((n for n, ok in zip(lengths, full) if ok), default=None)
    if expect_shortest is not None:
        assert shortest == expect_shortest
    if not full.any():
        with pytest.raises(UnsatisfiableConstraintError, match=f"at most {budget} tokens"):
            restrict_to_budget(d, budget)
        return
    restricted = restrict_to_budget(d, budget)
    assert np.array_equal(language(restricted, budget), full)
    assert restricted.num_states <= d.num_states + 1


def test_restrict_to_budget_returns_the_automaton_when_only_its_dead_state_is_left_out():
    """A restriction that would only rebuild the dead state is the automaton itself (no copy);
    one that leaves out a live state too is a new, smaller automaton with the same language."""
    from ctrlg.dfa.ops import restrict_to_budget

    d = dfa.length(1, 2, vocab_size=4)
    assert (~d.live_states()).sum() == 1                   # counts 0, 1, 2 and the dead state
    assert restrict_to_budget(d, 2) is d
    smaller = restrict_to_budget(d, 1)
    assert smaller is not d and smaller.num_states < d.num_states
    assert np.array_equal(language(smaller, 1), language(d, 1))


def test_restrict_to_budget_drops_unreachable_counter_states():
    from ctrlg.dfa.ops import restrict_to_budget

    d = dfa.length(0, 10**5, vocab_size=7)
    small = restrict_to_budget(d, 8)
    assert small.num_states <= 10
    assert small.accepts([1] * 8) and not small.accepts([1] * 9)


@pytest.mark.parametrize("tokens", [[1.5], "ab", [True], [None]])
def test_dfa_accepts_rejects_what_is_not_a_token_id(tokens):
    with pytest.raises(ConstraintError, match="token id|sequence of token ids"):
        dfa.phrase([1, 2], 5).accepts(tokens)


def test_dfa_is_accepting_checks_the_state():
    with pytest.raises(ConstraintError, match="state 99 out of range"):
        dfa.phrase([1, 2], 5).is_accepting(99)


# ---------------------------------------------------------------------- sampler / generate
@pytest.fixture(scope="module")
def padded_lm(smollm2_tokenizer):
    """A tiny Llama over the SmolLM2 tokenizer whose output layer is padded by 64 columns."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm2_tokenizer) + 64, hidden_size=16,
                         intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=64,
                         eos_token_id=smollm2_tokenizer.eos_token_id,
                         pad_token_id=smollm2_tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval()


def test_generate_rejects_a_dfa_narrower_than_the_tokenizer(padded_lm, smollm2_tokenizer):
    with pytest.raises(VocabularyMismatchError, match="vocabulary size 8 but the tokenizer has 49152"):
        ctrlg.generate(padded_lm, smollm2_tokenizer, "Hi", dfa.phrase([3], 8), mode="logical",
                       max_new_tokens=4, num_samples=2)


def test_generate_rejects_an_hmm_narrower_than_the_tokenizer(padded_lm, smollm2_tokenizer):
    hmm = small_hmm(V=8)
    with pytest.raises(VocabularyMismatchError, match="tokenizer has 49152"):
        ctrlg.generate(padded_lm, smollm2_tokenizer, "Hi", dfa.phrase([3], 8), hmm=hmm,
                       max_new_tokens=4, num_samples=2)


def test_generate_accepts_output_layer_padding(padded_lm, smollm2_tokenizer):
    V = len(smollm2_tokenizer)
    out = ctrlg.generate(padded_lm, smollm2_tokenizer, "Hi", dfa.phrase([3], V), mode="logical",
                         max_new_tokens=3, num_samples=2, rank_by_lm=False)
    assert out and all(3 in g.token_ids and max(g.token_ids) < V for g in out)


def test_processor_rejects_logits_much_wider_than_its_dfa():
    from ctrlg.sampler import ConstraintLogitsProcessor

    proc = ConstraintLogitsProcessor(None, dfa.phrase([3], 8), prompt_length=1, max_new_tokens=4,
                                     mode="logical")
    with pytest.raises(VocabularyMismatchError, match="49152 logits"):
        proc(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 49152))
    assert torch.isinf(proc(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 72))[0, 8:]).all()


@pytest.mark.parametrize("num_samples", [0, -1, 1.5])
def test_generate_rejects_bad_num_samples(padded_lm, smollm2_tokenizer, num_samples):
    V = len(smollm2_tokenizer)
    with pytest.raises(ConstraintError, match="num_samples"):
        ctrlg.generate(padded_lm, smollm2_tokenizer, "Hi", dfa.phrase([3], V), mode="logical",
                       max_new_tokens=2, num_samples=num_samples)


@pytest.mark.parametrize("kwargs", [dict(max_new_tokens=0), dict(max_new_tokens=-3),
                                    dict(max_new_tokens=2, min_new_tokens=3),
                                    dict(max_new_tokens=2, num_beams=0)])
def test_generate_rejects_bad_budgets(padded_lm, smollm2_tokenizer, kwargs):
    V = len(smollm2_tokenizer)
    with pytest.raises(ConstraintError, match="max_new_tokens|min_new_tokens|num_beams"):
        ctrlg.generate(padded_lm, smollm2_tokenizer, "Hi", dfa.phrase([3], V), mode="logical",
                       **kwargs)


def test_generate_rejects_a_constraint_that_is_a_list(padded_lm, smollm2_tokenizer):
    V = len(smollm2_tokenizer)
    with pytest.raises(ConstraintError, match="one TokenDFA"):
        ctrlg.generate(padded_lm, smollm2_tokenizer, "Hi", [dfa.phrase([3], V)] * 2,
                       mode="logical", max_new_tokens=2)


def test_processor_rejects_integer_scores():
    from ctrlg.sampler import ConstraintLogitsProcessor

    proc = ConstraintLogitsProcessor(small_hmm(V=5), dfa.phrase([3], 5), prompt_length=1,
                                     max_new_tokens=3)
    with pytest.raises(ConstraintError, match="floating-point"):
        proc(torch.zeros(1, 1, dtype=torch.long), torch.tensor([[0, -1, -2, -3, -4]]))


def test_processor_on_a_huge_counter_builds_tables_only_for_the_budget():
    from ctrlg.sampler import ConstraintLogitsProcessor

    start = time.perf_counter()
    proc = ConstraintLogitsProcessor(small_hmm(h=8, V=7), dfa.length(0, 10**5, vocab_size=7),
                                     prompt_length=1, max_new_tokens=8)
    assert time.perf_counter() - start < 5
    assert max(t.dfa.num_states for t in proc.tables) <= 10
    ids = torch.zeros(2, 1, dtype=torch.long)
    assert torch.isfinite(proc(ids, torch.zeros(2, 7))).all()


@settings(max_examples=100, deadline=None)
@given(d=token_dfas(max_states=7), limit=st.integers(0, 8))
def test_level_bfs_and_scipy_bfs_agree(d, limit):
    from ctrlg.dfa.ops import bfs_distances

    src, dst = d._edge_list()
    sources = np.nonzero(d.accepting)[0]
    by_levels = bfs_distances(sources, dst, src, d.num_states, limit=limit)
    by_scipy = bfs_distances(sources, dst, src, d.num_states)
    assert np.array_equal(by_levels, np.where(by_scipy <= limit, by_scipy, -1))


def test_concat_subset_construction_is_bounded_with_a_clear_error():
    """Found by the fuzz campaign: a concatenation whose subset construction ran for minutes."""
    V = 3
    first = dfa.complement(dfa.phrase([0], V))          # accepting states lead on: subsets needed
    second = dfa.phrase([1, 2], V)
    with pytest.raises(ConstraintError, match="max_states=2"):
        dfa.concat(first, second, max_states=2)
    both = dfa.concat(first, second)
    assert both.accepts([1, 2]) and both.accepts([0, 1, 2]) and not both.accepts([0, 2, 1])
