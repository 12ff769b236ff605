"""CommonGen+ (ctrlg.data.commongen_plus): the bundled file is what the documented builder makes
from the bundled dev split, and every item keeps the rules it promises."""

import json

import pytest

from ctrlg.data import load_commongen
from ctrlg.data._files import BUNDLED_DIR, DatasetError
from ctrlg.data.commongen_plus import (BUNDLED_NAME, FUNCTION_WORDS, build_commongen_plus,
                                       plus_rows, uses_concept, write_commongen_plus)


@pytest.fixture(scope="module")
def bundled_rows():
    return [json.loads(line) for line in
            (BUNDLED_DIR / BUNDLED_NAME).read_text(encoding="utf-8").splitlines()]


def test_the_bundled_file_is_rebuilt_byte_for_byte(tmp_path):
    path = write_commongen_plus(tmp_path / "plus.jsonl")
    assert path.read_bytes() == (BUNDLED_DIR / BUNDLED_NAME).read_bytes()


def test_every_item_keeps_the_rules(bundled_rows):
    dev = load_commongen()
    sizes = [row["size"] for row in bundled_rows]
    assert sizes == sorted(sizes) and {k: sizes.count(k) for k in set(sizes)} == \
        {5: 100, 6: 100, 7: 100, 8: 100, 9: 100}
    plus = load_commongen(f"bundled:{BUNDLED_NAME}")
    for row, item in zip(bundled_rows, plus):
        source = dev[row["source"]]
        assert len(item.concepts) == row["size"] > len(source.concepts)
        assert item.concepts[:len(source.concepts)] == source.concepts     # grown, not changed
        added = item.concepts[len(source.concepts):]
        assert len(set(added)) == len(added) and not set(added) & set(source.concepts)
        assert item.key == source.key + "#" + "#".join(row["added"])
        assert item.references and set(item.references) <= set(source.references)
        for reference in item.references:                 # a human sentence satisfies the item
            assert all(uses_concept(reference, c, p) for c, p in zip(item.concepts, item.pos))
        for added in item.concepts[len(source.concepts):]:
            assert added not in FUNCTION_WORDS
            # no added concept is a form of an original one (one word never counts twice)
            assert not any(uses_concept(added, c, p) for c, p in zip(source.concepts, source.pos))


def test_seed_and_sizes_are_honoured():
    dev = load_commongen(limit=120)
    first = plus_rows(build_commongen_plus(dev, sizes=(6,), per_size=5, seed=1))
    assert plus_rows(build_commongen_plus(dev, sizes=(6,), per_size=5, seed=1)) == first
    assert plus_rows(build_commongen_plus(dev, sizes=(6,), per_size=5, seed=2)) != first
    assert len(first) == 5 and all(row["size"] == 6 for row in first)
    with pytest.raises(DatasetError, match="sizes must be"):
        build_commongen_plus(dev, sizes=(), per_size=5)
    with pytest.raises(DatasetError, match="'no_such_file.jsonl' not found"):
        load_commongen("bundled:no_such_file.jsonl")
