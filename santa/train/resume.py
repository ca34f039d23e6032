"""Resuming a run: only registered checkpoints, and the newest one that loads.

Ray Train V2 registers a checkpoint (lists it in ``checkpoint_manager_snapshot.json``) once
its upload is complete, and ``ray.train.get_checkpoint()`` returns the latest registered
one. Two faults are left to santa:

- a run interrupted during an upload leaves an unregistered ``checkpoint_*`` folder: it is
  never resumed from, and the driver deletes it before the next attempt
  (:func:`remove_unregistered_checkpoints`);
- a registered checkpoint whose files are broken (a disk fault, a hand edit) would fail
  every resume: workers fall back to the next newest registered one that loads, and say
  which one they skipped (:func:`load_newest_loadable`).
"""

from __future__ import annotations

import logging
import posixpath
import sys
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from santa.files import storage
from santa.files.layout import CHECKPOINT_PREFIX, RUN_SNAPSHOT_FILE, RunLayout
from santa.models.checkpoints import _snapshot_candidates

logger = logging.getLogger(__name__)

__all__ = [
    "ResumeError",
    "load_newest_loadable",
    "ray_candidates",
    "registered_checkpoints",
    "remove_unregistered_checkpoints",
]


class ResumeError(RuntimeError):
    """No registered checkpoint of the run could be loaded."""


def registered_checkpoints(run_uri: str) -> list[str]:
    """URIs of the run's registered checkpoints, newest first (empty: a new run)."""
    location = storage.open_location(run_uri)
    snapshot = storage.read_json_or_none(location.child(RUN_SNAPSHOT_FILE), invalid_ok=True)
    names = _snapshot_candidates(snapshot) if snapshot is not None else None
    layout = RunLayout(run_uri)
    return [layout.checkpoint(name) for name, _ in names or []]


def remove_unregistered_checkpoints(run_uri: str) -> list[str]:
    """Delete ``checkpoint_*`` folders Ray never registered (interrupted uploads)."""
    location = storage.open_location(run_uri)
    snapshot = storage.read_json_or_none(location.child(RUN_SNAPSHOT_FILE), invalid_ok=True)
    names = _snapshot_candidates(snapshot) if snapshot is not None else []
    if names is None:
        return []  # a snapshot santa cannot read: leave Ray's folders alone
    registered = {name for name, _ in names}
    removed = []
    for entry in storage.list_dir(location):
        name = posixpath.basename(entry.path.rstrip("/"))
        if (
            entry.type == pafs.FileType.Directory
            and name.startswith(CHECKPOINT_PREFIX)
            and name not in registered
        ):
            location.fs.delete_dir(entry.path)
            removed.append(RunLayout(run_uri).checkpoint(name))
    for uri in removed:
        # Housekeeping after a cut upload (the run resumes from a registered one): the log
        # file says so; the terminal keeps its one line per fault.
        logger.info("removed %s: an unregistered (incomplete) checkpoint", uri)
    return removed


def _same_checkpoint(path: str, uri: str) -> bool:
    def norm(text: str) -> str:
        return text.removeprefix("s3://").rstrip("/")

    return norm(str(path)) == norm(uri)


def ray_candidates(latest: Any, registered: list[str]) -> list[Any]:
    """Ray's latest checkpoint (``ray.train.get_checkpoint()``), then the older ones of
    ``registered`` (the run's checkpoint URIs, newest first), as ``ray.train.Checkpoint``."""
    import ray.train

    return [latest] + [
        ray.train.Checkpoint(uri) for uri in registered if not _same_checkpoint(latest.path, uri)
    ]


def load_newest_loadable(
    candidates: list[Any],
    load: Callable[[Any], dict[str, Any]],
    *,
    announce: bool = True,
) -> tuple[dict[str, Any], Any]:
    """``load`` the first of ``candidates`` (checkpoints with a ``path``, newest first) that
    loads. Each one skipped is named on stderr (``announce``: rank 0 only). Returns the
    loaded state and the checkpoint it came from.
    """
    failures = []
    for checkpoint in candidates:
        try:
            return load(checkpoint), checkpoint
        except Exception as error:  # noqa: BLE001 - any unreadable file: try the next one
            reason = " ".join(str(error).split())[:200] or type(error).__name__
            failures.append(f"{checkpoint.path} ({reason})")
            if announce:
                print(
                    f"santa: warning: checkpoint {checkpoint.path} cannot be loaded "
                    f"({reason}); trying the previous one",
                    file=sys.stderr,
                    flush=True,
                )
    raise ResumeError("no registered checkpoint loads: " + "; ".join(failures))
