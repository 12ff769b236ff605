"""Atomic checkpoint folders: every file of a checkpoint is replaced together, or none is.

A checkpoint is a folder of several files (weights, a JSON config, optional extras such as a
prior head). Writing them one by one in place leaves a *mixed* checkpoint when the process fails
or is killed half-way (new weights beside the old config). :func:`atomic_folder` instead writes
every file into a fresh staging folder next to the target and then swaps the folders with two
``rename`` calls (atomic on one filesystem)::

    with atomic_folder(path, owned={"model.safetensors", "config.json"}) as staging:
        save_file(tensors, staging / "model.safetensors")
        (staging / "config.json").write_text(...)

After the block the target holds exactly the files written into ``staging``, plus the files of
the previous folder that the writer does not own (a user's notes, logs, sub-folders are kept).
Files it owns but did not write this time are dropped (so a stale companion file never pairs with
new weights). A failure inside the block leaves the previous checkpoint untouched.

Writers stamp every file with the same random :func:`new_save_id`; loaders compare the stamps
(:func:`check_same_save`) and reject a folder whose files come from different saves.

Staging folders are named ``.<target>.staging-<pid>-<random>``; those of processes that no longer
run (killed saves or conversions) are removed by :func:`remove_stale_staging`, which
:func:`atomic_folder` calls before each save.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from ctrlg.errors import CheckpointError, CheckpointWriteError

__all__ = ["atomic_folder", "new_save_id", "check_same_save", "remove_stale_staging",
           "staging_folder"]

_STAGING = ".staging-"
_RETIRED = ".retired-"


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(name: str) -> int | None:
    for marker in (_STAGING, _RETIRED):
        if marker in name:
            head = name.split(marker, 1)[1].split("-", 1)[0]
            return int(head) if head.isdigit() else None
    return None


def remove_stale_staging(parent, target_name: str) -> list[Path]:
    """Remove the staging / retired folders of ``target_name`` in ``parent`` whose writing process
    no longer runs (a killed save or model conversion). Returns the removed paths."""
    parent = Path(parent)
    removed = []
    if not parent.is_dir():
        return removed
    prefix = f".{target_name}"
    for entry in parent.iterdir():
        if not entry.name.startswith(prefix + _STAGING) and \
                not entry.name.startswith(prefix + _RETIRED):
            continue
        pid = _owner_pid(entry.name)
        if pid is not None and (pid == os.getpid() or _pid_alive(pid)):
            continue                     # a save in progress (ours or another process's)
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


def publish(staging: Path, target: Path, owned: Iterable[str] = ()) -> None:
    """Replace ``target`` by ``staging`` (two renames), carrying over the files of the old
    ``target`` that are not in ``owned`` and were not written into ``staging``."""
    owned = set(owned)
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target} exists and is not a folder; choose another path")
    if not target.exists():
        staging.rename(target)
        return
    for entry in target.iterdir():
        if entry.name not in owned and not (staging / entry.name).exists():
            entry.rename(staging / entry.name)
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}{_RETIRED}{os.getpid()}-",
                                    dir=target.parent))
    retired.rmdir()
    target.rename(retired)
    staging.rename(target)
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
