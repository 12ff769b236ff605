"""Atomic checkpoint folders: every file of a checkpoint is replaced together, or none is.

A checkpoint is a folder of several files (weights, a JSON config, optional extras such as a
prior head). Writing them one by one in place leaves a *mixed* checkpoint when the process fails
or is killed half-way (new weights beside the old config). :func:`atomic_folder` instead writes
every file into a fresh staging folder next to the target and then swaps the folders with
``rename`` calls (atomic on one filesystem)::

    with atomic_folder(path, owned={"model.safetensors", "config.json"}) as staging:
        save_file(tensors, staging / "model.safetensors")
        (staging / "config.json").write_text(...)

After the block the target holds exactly the files written into ``staging``, plus the files of
the previous folder that the writer does not own (a user's notes, logs, sub-folders are kept).
Files it owns but did not write this time are dropped (so a stale companion file never pairs with
new weights). A failure inside the block leaves the previous checkpoint untouched.

**Publishing survives a SIGKILL at any point** (:func:`publish`): (1) the staged files are
fsynced; (2) the files of the old folder that are kept are *hard-linked* into the staging folder
(copied where links are impossible), so the originals stay where they were; (3) the staging
folder is renamed ``.<target>.ready-<pid>-<random>``: a complete new checkpoint; (4) the old
folder is renamed ``.<target>.retired-<pid>-<random>``; (5) the ready folder becomes the target;
(6) the retired folder is removed. Killed anywhere, the path holds the old or the new complete
checkpoint, or neither between (4) and (5): then the next save or load puts the ready folder
(else the newest retired one) back at the path (:func:`recover`) before anything is removed.
Leftovers of processes that no longer run are removed only while a checkpoint is at the path:
a staging folder (never complete), and ready or retired folders (complete copies, but the path
holds one), so the clean-up never deletes the only complete copy and never a user's file (the
originals stay in the old folder until it is retired whole).

Writers stamp every file with the same random :func:`new_save_id`; loaders compare the stamps
(:func:`check_same_save`) and reject a folder whose files come from different saves. They also
record a SHA-256 per tensor file (:func:`file_sha256`) and :func:`check_checksums` compares it
on load, so a flipped bit is a clear error instead of silently different weights.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from ctrlg.errors import CheckpointError, CheckpointWriteError

__all__ = ["atomic_folder", "new_save_id", "check_same_save", "remove_stale_staging",
           "staging_folder", "recover", "publish", "file_sha256", "check_checksums"]

_STAGING = ".staging-"
_READY = ".ready-"
_RETIRED = ".retired-"
_MARKERS = (_STAGING, _READY, _RETIRED)


def new_save_id() -> str:
    """A random id written into every file of one save (see :func:`check_same_save`)."""
    return uuid.uuid4().hex


def check_same_save(folder, stamps: dict[str, str | None]) -> None:
    """Raise CheckpointError unless every file's save id in ``stamps`` (file name → id, None when
    the file carries none) is the same: a folder mixing files of different saves is rejected.
    Files that carry no id at all (checkpoints written before ids existed) are accepted only
    when no file carries one."""
    ids = set(stamps.values())
    if len(ids) > 1:
        listing = ", ".join(f"{name}: {sid or 'none'}" for name, sid in sorted(stamps.items()))
        raise CheckpointError(
            f"{folder} mixes files of different saves ({listing}); the checkpoint was modified "
            "or a save was interrupted outside ctrlg — save it again")


def file_sha256(path) -> str:
    """The SHA-256 of a file's bytes, in hex (read in blocks of 1 MiB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_checksums(folder, checksums, *, recorded_in: str = "its config") -> None:
    """CheckpointError unless each file named in ``checksums`` (file name → SHA-256 hex, as
    recorded in a config at save time) has that checksum; a checkpoint saved before checksums
    existed (``checksums`` None) passes. A record that is not such a mapping (a name that is not
    a plain file name of ``folder``, a digest that is not 64 hex digits) is a CheckpointError
    too. ``recorded_in`` names the file that holds the record, for the messages."""
    if checksums is None:
        return
    if not isinstance(checksums, dict):
        raise CheckpointError(f"{folder}: 'checksums' in {recorded_in} must map file names to "
                              f"SHA-256 digests, got {checksums!r}")
    for name, expected in sorted(checksums.items(), key=lambda item: str(item[0])):
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            raise CheckpointError(f"{folder}: 'checksums' in {recorded_in} names {name!r}, which "
                                  f"is not a file name of the checkpoint; save it again")
        if not (isinstance(expected, str) and len(expected) == 64
                and all(c in "0123456789abcdef" for c in expected.lower())):
            raise CheckpointError(f"{folder}: the checksum {recorded_in} records for {name} is "
                                  f"not a SHA-256 digest (64 hex digits), got {expected!r}; save "
                                  f"the checkpoint again")
        path = Path(folder) / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing, although {recorded_in} records its "
                                  f"checksum; save the checkpoint again")
        got = file_sha256(path)
        if got != expected.lower():
            raise CheckpointError(
                f"{path} does not match the SHA-256 {recorded_in} records ({expected[:16]}… "
                f"recorded, {got[:16]}… found): the file is truncated or corrupt, or was changed "
                f"after the save; restore it or save the checkpoint again")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(name: str) -> int | None:
    for marker in _MARKERS:
        if marker in name:
            head = name.split(marker, 1)[1].split("-", 1)[0]
            return int(head) if head.isdigit() else None
    return None


def _leftovers(parent: Path, target_name: str) -> dict[str, list[Path]]:
    """The staging / ready / retired folders of ``target_name`` in ``parent`` whose writing
    process no longer runs (ours and live ones' are a save in progress), newest first."""
    found: dict[str, list[Path]] = {m: [] for m in _MARKERS}
    prefix = f".{target_name}"
    for entry in parent.iterdir():
        marker = next((m for m in _MARKERS if entry.name.startswith(prefix + m)), None)
        if marker is None:
            continue
        pid = _owner_pid(entry.name)
        if pid is not None and (pid == os.getpid() or _pid_alive(pid)):
            continue
        found[marker].append(entry)
    for entries in found.values():
        entries.sort(key=lambda e: e.stat().st_mtime if e.exists() else 0, reverse=True)
    return found


def recover(target) -> Path | None:
    """When no checkpoint is at ``target`` but a killed save left a complete copy beside it,
    put that copy back (the ready folder: the new checkpoint, else the newest retired one: the
    old; module docstring) and return the folder it came from; None when there was nothing to
    do. CheckpointError naming the copy when it cannot be moved."""
    target = Path(target)
    if target.exists() or not target.parent.is_dir():
        return None
    found = _leftovers(target.parent, target.name)
    for source in (*found[_READY], *found[_RETIRED]):
        try:
            source.rename(target)
        except FileNotFoundError:       # another process recovered it first
            continue
        except OSError as err:
            raise CheckpointError(
                f"{target} is missing, but an interrupted save left a complete copy in {source} "
                f"that cannot be moved back ({err.strerror or err}); rename it to {target}") from None
        return source
    return None


def remove_stale_staging(parent, target_name: str) -> list[Path]:
    """Recover ``parent / target_name`` (:func:`recover`), then remove the staging / ready /
    retired folders of it whose writing process no longer runs (a killed save or model
    conversion) — ready and retired ones only while a folder is at the path, so never the only
    complete copy. Returns the removed paths."""
    parent = Path(parent)
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    target = parent / target_name
    recover(target)
    found = _leftovers(parent, target_name)
    doomed = found[_STAGING] + ((found[_READY] + found[_RETIRED]) if target.exists() else [])
    for entry in doomed:
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def staging_folder(target) -> Path:
    """A new empty folder beside ``target`` (same filesystem, so it can be renamed onto it),
    named after the target and this process's id. CheckpointWriteError naming ``target`` when
    its folder cannot be created or written."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(target.parent, target.name)
        return Path(tempfile.mkdtemp(prefix=f".{target.name}{_STAGING}{os.getpid()}-",
                                     dir=target.parent))
    except OSError as err:
        raise CheckpointWriteError(
            f"cannot save to {target}: its folder {target.parent} cannot be created or written "
            f"({err.strerror or err}); choose a folder you can write to") from None


def _fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder`` and the folders themselves (the data is on disk before
    a rename makes it the checkpoint)."""
    for root, dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _link_tree(source: Path, dest: Path) -> None:
    """``source`` (a file, a symlink or a folder) at ``dest``, by hard links (a copy where a link
    is impossible): the original stays where it is."""
    if source.is_symlink():
        os.symlink(os.readlink(source), dest)
    elif source.is_dir():
        dest.mkdir()
        for entry in source.iterdir():
            _link_tree(entry, dest / entry.name)
    else:
        try:
            os.link(source, dest)
        except OSError:
            shutil.copy2(source, dest)


def _sibling(target: Path, marker: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=f".{target.name}{marker}{os.getpid()}-", dir=target.parent))
    path.rmdir()                          # a free name beside the target, for a rename
    return path


def publish(staging: Path, target: Path, owned: Iterable[str] = ()) -> None:
    """Replace ``target`` by ``staging``, carrying over the files of the old ``target`` that are
    not in ``owned`` and were not written into ``staging`` (module docstring: safe against a
    kill at any point)."""
    owned = set(owned)
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target} exists and is not a folder; choose another path")
    _fsync_tree(staging)
    if target.exists():
        for entry in target.iterdir():
            if entry.name not in owned and not os.path.lexists(staging / entry.name):
                _link_tree(entry, staging / entry.name)
    ready = _sibling(target, _READY)
    staging.rename(ready)
    retired = None
    try:
        if target.exists():
            retired = _sibling(target, _RETIRED)
            target.rename(retired)
        ready.rename(target)
    except OSError:
        if target.exists():               # the old folder is still (or again) in place
            shutil.rmtree(ready, ignore_errors=True)
        elif retired is not None and retired.exists():
            retired.rename(target)        # put the old folder back
            shutil.rmtree(ready, ignore_errors=True)
        raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


@contextmanager
def atomic_folder(target, owned: Iterable[str] = ()) -> Iterator[Path]:
    """Yield a staging folder; on normal exit it replaces ``target`` atomically (module
    docstring). ``owned``: the file names this kind of checkpoint may contain — the ones not
    rewritten are dropped, every other file of the old folder is kept."""
    target = Path(target)
    staging = staging_folder(target)
    try:
        yield staging
        publish(staging, target, owned)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, CheckpointWriteError):
            raise
        raise CheckpointWriteError(
            f"saving {target} failed: {err.strerror or err}; the previous contents of {target} "
            f"are unchanged") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
