"""The train tuning split (ctrlg.data.commongen_tuning): grouping, stratification and the bundled
file, checked against direct counts."""

from collections import Counter

import pytest

from ctrlg.data._files import DatasetError, bundled_path
from ctrlg.data.commongen import load_commongen
from ctrlg.data.commongen_tuning import (TUNING_FILE, group_train_pairs, stratified_tuning_split,
                                         write_tuning_split)


def test_group_train_pairs_joins_consecutive_sources_only():
    rows = group_train_pairs(["a b", "a b", "c d e", "a b"], ["s1", "s2", "s3", "s4"])
    assert rows == [{"concept_set": "a#b", "scene": ["s1", "s2"]},
                    {"concept_set": "c#d#e", "scene": ["s3"]},
                    {"concept_set": "a#b", "scene": ["s4"]}]
    with pytest.raises(DatasetError, match="2 source lines but 1 target"):
        group_train_pairs(["a", "b"], ["x"])


def test_stratified_split_counts_distinctness_and_prefix_mix():
    rows = [{"concept_set": "#".join(f"w{i}_{j}" for j in range(size)), "scene": [str(i)]}
            for size in (3, 4, 5) for i in range(40)]
    mix = {3: 20, 4: 10, 5: 10}
    split = stratified_tuning_split(rows, mix, seed=3)
    sizes = [len(row["concept_set"].split("#")) for row in split]
    assert Counter(sizes) == Counter(mix)
    assert len({row["concept_set"] for row in split}) == 40
    for n in (4, 8, 20, 40):  # every prefix holds the mix to within one item per size
        prefix = Counter(sizes[:n])
        for size, want in mix.items():
            assert abs(prefix[size] - n * want / 40) <= 1
    assert split == stratified_tuning_split(rows, mix, seed=3)
    assert split != stratified_tuning_split(rows, mix, seed=4)
    with pytest.raises(DatasetError, match="41 concept sets of size 3"):
        stratified_tuning_split(rows, {3: 41}, seed=0)


def test_bundled_tuning_file_is_what_the_builder_writes(tmp_path):
    written = write_tuning_split(tmp_path / "tune.jsonl")
    assert written.read_bytes() == bundled_path(TUNING_FILE).read_bytes()
    items = load_commongen(written)
    dev = load_commongen()
    assert Counter(len(e.concepts) for e in items) == Counter(len(e.concepts) for e in dev)
    train_sets = {" ".join(line.split()) for line in
                  bundled_path("commongen.train.src_alpha.txt").read_text().splitlines()}
    assert all(" ".join(e.concepts) in train_sets and e.references for e in items)
    assert not {e.concepts for e in items} & {e.concepts for e in dev}
