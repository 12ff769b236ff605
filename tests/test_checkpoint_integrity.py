"""Checkpoints that survive a kill inside the save, and that say so when they are damaged: a
SIGKILL at every system call of the publish step leaves the old or the new checkpoint (recovered
by the next load or save) and the user's files; each tensor file's SHA-256 is verified on load
(checkpoints saved before checksums still load); bad quantised data or schemes are
CheckpointErrors, not torch's RuntimeError or AttributeError."""

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import ctrlg
from benchmarks.fuzz_storage import save_killed_at
from ctrlg import checkpoint
from ctrlg.errors import CheckpointError
from ctrlg.hmm.prior_head import HEAD_CONFIG_NAME, HEAD_WEIGHTS_NAME, PriorHead

ASSETS = Path(ctrlg.__file__).parent / "assets"


def file_sha256(path):
    """The oracle: SHA-256 of the file's bytes, by hashlib directly."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def small_hmm(seed=0, h=3, V=12):
    g = torch.Generator().manual_seed(seed)
    return ctrlg.HMM.from_params(torch.softmax(torch.randn(h, generator=g), -1),
                                 torch.softmax(torch.randn(h, h, generator=g), -1),
                                 torch.softmax(torch.randn(h, V, generator=g) * 3, -1))


def same_params(a, b):
    return all(torch.allclose(x, y) for x, y in ((a.initial, b.initial), (a.transition, b.transition),
                                                 (a.emission, b.emission)))


# ------------------------------------------------------------------------- kill points
def test_a_save_killed_at_any_point_leaves_a_complete_checkpoint_and_the_users_files(tmp_path):
    """Before, a kill after the old folder was renamed away left no checkpoint at the path, and
    the next save's clean-up deleted both the retired old one and the staged new one; a user's
    file moved into the staging folder vanished with it. Now the path holds the old or the new
    checkpoint after a kill anywhere in the publish step (after the load or save that follows
    recovers it), the user's file is kept, and a later save leaves nothing beside the path."""
    old, new, newest = small_hmm(1), small_hmm(2), small_hmm(3)
    killed_at = []
    for k in range(1, 60):
        path = tmp_path / f"k{k}" / "hmm"
        old.save(path)
        (path / "NOTES.txt").write_text("the user's notes")
        (path / "runs").mkdir()
        (path / "runs" / "log.txt").write_text("a user's folder")
        if not save_killed_at(lambda: new.save(path), k):
            break
        killed_at.append(k)
        loaded = ctrlg.HMM.load(path)                          # recovers a half-published save
        assert same_params(loaded, old) or same_params(loaded, new), k
        assert (path / "NOTES.txt").read_text() == "the user's notes", k
        assert (path / "runs" / "log.txt").read_text() == "a user's folder", k
        newest.save(path)
        assert same_params(ctrlg.HMM.load(path), newest), k
        assert (path / "NOTES.txt").read_text() == "the user's notes", k
        assert sorted(p.name for p in path.parent.iterdir()) == ["hmm"], k
    assert len(killed_at) >= 12, killed_at                      # every call of publish was hit
    assert killed_at == list(range(1, len(killed_at) + 1))


def test_a_save_killed_between_the_two_renames_is_recovered_by_the_next_save(tmp_path):
    """The next save (not a load) finds the path empty: it puts the complete copy back before
    its clean-up, instead of deleting it."""
    old, new = small_hmm(1), small_hmm(2)
    path = old.save(tmp_path / "hmm")
    (path / "NOTES.txt").write_text("mine")
    ready = tmp_path / ".hmm.ready-999999999-x"                  # a killed save's new checkpoint
    retired = tmp_path / ".hmm.retired-999999999-y"              # ... and the old one
    new.save(ready)
    (ready / "NOTES.txt").write_text("mine")
    path.rename(retired)
    assert checkpoint.remove_stale_staging(tmp_path, "hmm") == [retired]
    assert same_params(ctrlg.HMM.load(path), new)
    path.rename(retired)                                         # a retired copy alone
    checkpoint.recover(path)
    assert same_params(ctrlg.HMM.load(path), new) and not retired.exists()


def test_a_stale_ready_or_retired_copy_is_removed_only_when_the_path_holds_one(tmp_path):
    lone = tmp_path / ".h.retired-999999999-z"
    small_hmm(1).save(lone)
    assert checkpoint.remove_stale_staging(tmp_path, "h") == []  # recovered, not removed
    assert same_params(ctrlg.HMM.load(tmp_path / "h"), small_hmm(1))
    small_hmm(2).save(tmp_path / ".h.ready-999999999-z")
    assert checkpoint.remove_stale_staging(tmp_path, "h") == [tmp_path / ".h.ready-999999999-z"]


# ------------------------------------------------------------------------- checksums
def _flip(path, bit):
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


def _with_head(hmm):
    hmm.prior_head = PriorHead(8, hmm.hidden_size, inner_size=4)
    return hmm


@pytest.mark.parametrize("name", ["model.safetensors", HEAD_WEIGHTS_NAME])
def test_every_single_bit_flip_in_a_tensor_file_is_a_clear_error(tmp_path, name):
    """Before, 446 of 600 random single-bit flips of model.safetensors loaded silently, and so
    did flips in prior_head.safetensors. Now config.json records each tensor file's SHA-256
    and every flip is a CheckpointError naming the file."""
    path = _with_head(small_hmm(1)).save(tmp_path / "clean")
    config = json.loads((path / "config.json").read_text())
    assert set(config["checksums"]) == {"model.safetensors", HEAD_WEIGHTS_NAME}
    assert config["checksums"]["model.safetensors"] == file_sha256(path / "model.safetensors")
    size = (path / name).stat().st_size * 8
    rng = random.Random(name)
    for bit in rng.sample(range(size), 40):
        copy = tmp_path / f"flip{bit}"
        shutil.copytree(path, copy)
        _flip(copy / name, bit)
        with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
            ctrlg.HMM.load(copy)
        shutil.rmtree(copy)


def test_a_prior_head_saved_apart_verifies_its_checksum(tmp_path):
    hmm = small_hmm(1)
    head = PriorHead(8, hmm.hidden_size, inner_size=0)
    head.save(tmp_path / "head")
    assert json.loads((tmp_path / "head" / HEAD_CONFIG_NAME).read_text())["weights_sha256"] == \
        file_sha256(tmp_path / "head" / HEAD_WEIGHTS_NAME)
    PriorHead.load(tmp_path / "head")
    _flip(tmp_path / "head" / HEAD_WEIGHTS_NAME, 8 * 200 + 3)
    with pytest.raises(CheckpointError, match="SHA-256"):
        PriorHead.load(tmp_path / "head")


def _shipped():
    return [p for p in sorted(ASSETS.glob("hmm_*")) if (p / "config.json").is_file()]


def test_checkpoints_saved_before_checksums_still_load(tmp_path):
    """The checkpoints shipped before checksums carry none (the smallest is loaded here, every
    shipped one in the heavy test below); neither does one saved by an earlier version (simulated by removing
    the records): both load as before."""
    legacy = [p for p in _shipped() if "checksums" not in json.loads((p / "config.json").read_text())]
    assert legacy
    smallest = min(legacy, key=lambda p: (p / "model.safetensors").stat().st_size)
    assert ctrlg.HMM.load(smallest).hidden_size > 0
    path = _with_head(small_hmm(2)).save(tmp_path / "h")
    config = json.loads((path / "config.json").read_text())
    del config["checksums"]
    (path / "config.json").write_text(json.dumps(config))
    head_config = json.loads((path / HEAD_CONFIG_NAME).read_text())
    del head_config["weights_sha256"]
    (path / HEAD_CONFIG_NAME).write_text(json.dumps(head_config))
    loaded = ctrlg.HMM.load(path)
    assert same_params(loaded, small_hmm(2)) and loaded.prior_head is not None


@pytest.mark.heavy
def test_every_shipped_checkpoint_loads_with_or_without_checksums():
    for folder in _shipped():
        assert ctrlg.HMM.load(folder).hidden_size > 0


@pytest.mark.parametrize("checksums", [[1, 2], "abc", {"model.safetensors": "0" * 64},
                                       {"missing.safetensors": "0" * 64}])
def test_a_bad_checksum_record_is_a_clear_error(tmp_path, checksums):
    path = small_hmm(1).save(tmp_path / "h")
    config = json.loads((path / "config.json").read_text())
    config["checksums"] = checksums
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="checksum|SHA-256"):
        ctrlg.HMM.load(path)


# ------------------------------------------------------------------------- quantised data
def _rewrite(path, change_tensors=None, change_config=None):
    """Rewrite the checkpoint in ``path`` with its tensors / config changed, keeping its save id
    and recording the new file's checksum (a deliberate edit, not a bit flip)."""
    with safe_open(str(path / "model.safetensors"), "pt") as handle:
        metadata = handle.metadata()
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    if change_tensors:
        change_tensors(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata=metadata)
    config = json.loads((path / "config.json").read_text())
    config["checksums"] = {"model.safetensors": file_sha256(path / "model.safetensors")}
    if change_config:
        change_config(config)
    (path / "config.json").write_text(json.dumps(config))


def _set(name, value):
    def change(t):
        t[name] = value(t[name]) if callable(value) else value
    return change


TOPK_DAMAGE = {
    "index past V": _set("emission_topk_index", lambda t: t.clone().fill_(40)),
    "negative index (int32)": _set("emission_topk_index", lambda t: t.to(torch.int32).neg() - 1),
    "a token twice in a row": _set("emission_topk_index", lambda t: t.clone().fill_(3)),
    "index of another shape": _set("emission_topk_index", lambda t: t[:, :2].contiguous()),
    "float index": _set("emission_topk_index", lambda t: t.float()),
    "codes of another shape": _set("emission_codes", lambda t: t[:2].contiguous()),
    "codes not uint8": _set("emission_codes", lambda t: t.to(torch.int32)),
    "lo of another shape": _set("emission_lo", lambda t: t[:1].contiguous()),
    "NaN step": _set("emission_step", lambda t: torch.full_like(t, float("nan"))),
    "rest of another shape": _set("emission_rest", lambda t: t.repeat(2)),
    "negative background": _set("emission_background", lambda t: -t),
    "background of two dims": _set("emission_background", lambda t: t[None]),
}
DENSE_DAMAGE = {
    "codes of one dim": _set("emission_codes", lambda t: t.reshape(-1)),
    "codes of another width": _set("emission_codes", lambda t: t[:, :5].contiguous()),
    "codes not uint8": _set("emission_codes", lambda t: t.float()),
    "lo of another shape": _set("emission_lo", lambda t: t.repeat(2)),
    "infinite lo": _set("emission_lo", lambda t: torch.full_like(t, float("inf"))),
    "zero step": _set("emission_step", lambda t: torch.zeros_like(t)),
    "step of two dims": _set("emission_step", lambda t: t[:, None]),
}


@pytest.mark.parametrize("damage", sorted(TOPK_DAMAGE))
def test_bad_topk8_data_is_a_checkpoint_error(tmp_path, damage):
    """Before, an index outside [0, V) or a tensor of the wrong shape raised torch's
    RuntimeError (or loaded a wrong emission)."""
    path = small_hmm(1, h=4, V=30).save(tmp_path / "h", emission_quantization="topk8-6")
    _rewrite(path, TOPK_DAMAGE[damage])
    with pytest.raises(CheckpointError, match="emission_"):
        ctrlg.HMM.load(path)


@pytest.mark.parametrize("scheme", ["log8", "normq8"])
@pytest.mark.parametrize("damage", sorted(DENSE_DAMAGE))
def test_bad_dense_8bit_data_is_a_checkpoint_error(tmp_path, scheme, damage):
    path = small_hmm(1, h=4, V=30).save(tmp_path / "h", emission_quantization=scheme)
    _rewrite(path, DENSE_DAMAGE[damage])
    with pytest.raises(CheckpointError, match="emission"):
        ctrlg.HMM.load(path)


@pytest.mark.parametrize("scheme", [5, ["log8"], {"log8": 1}, "", "log9", "topk8-0", True])
def test_a_bad_emission_quantization_is_a_checkpoint_error_in_save_and_in_the_config(tmp_path,
                                                                                     scheme):
    """Before, ``emission_quantization: 5`` or ``["log8"]`` raised AttributeError / TypeError
    (and ``""`` or ``false`` in config.json silently meant unquantised)."""
    with pytest.raises(CheckpointError, match="emission quantization"):
        small_hmm(1).save(tmp_path / "s", emission_quantization=scheme)
    assert not (tmp_path / "s").exists()
    path = small_hmm(1).save(tmp_path / "h", emission_quantization="log8")
    _rewrite(path, change_config=lambda c: c.update(emission_quantization=scheme))
    with pytest.raises(CheckpointError, match="emission quantization"):
        ctrlg.HMM.load(path)
