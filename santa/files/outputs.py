"""Preprocess outputs published whole or not at all, one run's files per output folder.

A job writes into a staging place of its own and publishes at the end:

- **local**: a sibling folder ``OUT.tmp-<run id>``, renamed onto ``OUT`` when complete
  (the previous ``OUT`` is moved aside first and deleted after; SIGINT is held back
  during the two renames). An interrupted run deletes its staging folder; ``OUT`` is
  never touched before the end. A folder left by a run that was killed outright
  (``kill -9``, a lost node) names its owner (host, pid) and is deleted by the next run
  once that process is gone.
- **S3** (no rename there): a run-unique prefix ``OUT/runs/<run id>/``, and the manifest
  ``OUT/report.json``, written LAST, names it. Readers trust only the manifest
  (:func:`published_root`), so a half-written prefix is never read; after publishing,
  everything else under ``OUT`` (earlier runs, files of an older layout) is deleted.

The manifest is the job's report with a ``manifest`` entry: ``complete``, ``run_id``,
``prefix`` (empty for local outputs) and ``published_at``; the report's ``config`` records
the options the output was made with (:func:`matching_manifest`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shutil
import signal
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from santa.files import storage

__all__ = [
    "MANIFEST_FILE",
    "StagedOutput",
    "matching_manifest",
    "published_root",
    "read_manifest",
    "check_output_owner",
    "claim_output",
    "output_kind",
    "staged_output",
]

logger = logging.getLogger(__name__)

MANIFEST_FILE = "report.json"
RUNS_PREFIX = "runs"
TOOL_KEY = "tool"
LEASE_FILE = ".santa-lock.json"  # santa.files.layout's S3 lease, kept by a publish


@dataclass(frozen=True)
class StagedOutput:
    """Where one run writes (``staging``) before it is published at ``uri``."""

    uri: str
    run_id: str
    staging: str
    tool: str = ""
    """The job that writes it (recorded in the manifest: see :func:`output_kind`)."""

    @property
    def prefix(self) -> str:
        """The staging folder relative to ``uri`` (S3), or empty (local: renamed in)."""
        return f"{RUNS_PREFIX}/{self.run_id}" if storage.is_s3(self.uri) else ""

    def publish(self, report: dict[str, Any]) -> dict[str, Any]:
        """Write the manifest (the report, marked complete) and make this run the output."""
        manifest = dict(report)
        if self.tool:
            manifest.setdefault(TOOL_KEY, self.tool)
        manifest["manifest"] = {
            "complete": True,
            "run_id": self.run_id,
            "prefix": self.prefix,
            "published_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        if storage.is_s3(self.uri):
            storage.write_json(storage.join(self.staging, MANIFEST_FILE), manifest)
            storage.write_json(storage.join(self.uri, MANIFEST_FILE), manifest)  # the commit
            _delete_other_s3_entries(
                self.uri, keep={MANIFEST_FILE, RUNS_PREFIX, LEASE_FILE}, run=self.run_id
            )
        else:
            storage.write_json(storage.join(self.staging, MANIFEST_FILE), manifest)
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.staging, OWNER_FILE))
            _rename_into_place(self.staging, self.uri, self.run_id)
        return manifest

    def abandon(self) -> None:
        """Delete what this run staged (best effort: an interrupted run must not fail here)."""
        try:
            storage.delete_dir(self.staging)
        except Exception as error:  # noqa: BLE001 - cleanup after another error
            logger.warning("could not delete the staging folder %s: %s", self.staging, error)


def new_run_id() -> str:
    """A sortable, unique run id: UTC time and a random suffix."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{now}-{uuid.uuid4().hex[:8]}"


OWNER_FILE = ".santa-owner"


def stage(uri: str, tool: str = "") -> StagedOutput:
    """A staging place for one run's output at ``uri``.

    Locally the staging folder is created with an owner file (host and pid), and staging
    folders of earlier runs whose process is gone are deleted first.
    """
    run_id = new_run_id()
    if storage.is_s3(uri):
        return StagedOutput(
            uri, run_id, storage.join(uri.rstrip("/"), RUNS_PREFIX, run_id), tool=tool
        )
    final = storage.absolute(uri).rstrip(os.sep)
    remove_abandoned_staging(final)
    staging = f"{final}.tmp-{run_id}"
    os.makedirs(staging)
    with open(os.path.join(staging, OWNER_FILE), "w") as handle:
        handle.write(f"{socket.gethostname()} {os.getpid()}\n")
    return StagedOutput(final, run_id, staging, tool=tool)


def _owner_alive(folder: str) -> bool:
    """Whether the run that owns ``folder`` may still be writing it."""
    try:
        with open(os.path.join(folder, OWNER_FILE)) as handle:
            host, pid = handle.read().split()
    except (OSError, ValueError):
        return True  # no owner file (an older santa, or not written yet): leave it
    if host != socket.gethostname():
        return True  # another machine's process: cannot tell
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def remove_abandoned_staging(final: str) -> list[str]:
    """Delete ``final.tmp-*`` / ``final.old-*`` folders of runs that died; return them."""
    parent, name = os.path.split(final)
    removed = []
    try:
        siblings = os.listdir(parent or ".")
    except OSError:
        return removed
    for sibling in sorted(siblings):
        if sibling.startswith(f"{name}.tmp-"):
            dead = not _owner_alive(os.path.join(parent, sibling))
        elif sibling.startswith(f"{name}.old-"):
            # The previous output moved aside by a publish: garbage once the new output is
            # in place (its staging folder renamed), kept if the publish died in between.
            run_id = sibling[len(f"{name}.old-") :]
            dead = os.path.isdir(final) and f"{name}.tmp-{run_id}" not in siblings
        else:
            continue
        folder = os.path.join(parent, sibling)
        if os.path.isdir(folder) and dead:
            shutil.rmtree(folder, ignore_errors=True)
            logger.warning("deleted %s, left by a run that died", folder)
            removed.append(folder)
    return removed


@contextlib.contextmanager
def staged_output(uri: str, tool: str = "") -> Iterator[StagedOutput]:
    """Stage an output; anything raised inside (Ctrl-C too) deletes the staging folder."""
    staged = stage(uri, tool=tool)
    try:
        yield staged
    except BaseException as error:
        from santa.jobs.errors import root_cause

        # An S3 endpoint that did not answer would make the delete wait its timeouts again
        # before the job's line (issue 40); the staging folder is left to the next run.
        if storage.unreachable(root_cause(error)) is None:
            staged.abandon()
        raise


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT delivered after the block (renames of a publish are not interrupted)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _rename_into_place(staging: str, final: str, run_id: str) -> None:
    """Replace ``final`` with ``staging`` (local folders), keeping one of them whole."""
    os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
    aside = f"{final}.old-{run_id}"
    with _sigint_held():
        if os.path.lexists(final):
            if not os.path.isdir(final) or os.path.islink(final):
                raise storage.StorageError(f"output {final} exists and is not a folder")
            os.rename(final, aside)
        os.rename(staging, final)
    shutil.rmtree(aside, ignore_errors=True)


def _delete_other_s3_entries(uri: str, keep: set[str], run: str) -> None:
    """Delete every entry under ``uri`` but ``keep`` and ``runs/<run>`` (best effort)."""
    try:
        location = storage.open_location(uri)
        for entry in storage.list_dir(location):
            name = entry.path.rstrip("/").rsplit("/", 1)[-1]
            if name == RUNS_PREFIX and entry.type == pafs.FileType.Directory:
                for old in storage.list_dir(location.child(RUNS_PREFIX)):
                    if old.path.rstrip("/").rsplit("/", 1)[-1] != run:
                        _delete_entry(location.fs, old)
            elif name not in keep:
                _delete_entry(location.fs, entry)
    except (OSError, storage.StorageError) as error:
        logger.warning("published %s, but could not delete earlier files: %s", uri, error)


def _delete_entry(fs: pafs.FileSystem, entry: pafs.FileInfo) -> None:
    if entry.type == pafs.FileType.Directory:
        fs.delete_dir(entry.path)
    else:
        fs.delete_file(entry.path)


def read_manifest(uri: str) -> dict[str, Any] | None:
    """The complete manifest of a published output, or None (nothing published there)."""
    manifest_uri = storage.join(uri, MANIFEST_FILE)
    try:
        if not storage.exists(manifest_uri):
            return None
        manifest = storage.read_json(manifest_uri)
    except ValueError:
        return None  # half-written or foreign: not a publish
    if not isinstance(manifest, dict):
        return None
    if not (manifest.get("manifest") or {}).get("complete"):
        return None
    return manifest


def published_root(uri: str) -> str:
    """The folder holding the published files of the output at ``uri``.

    An S3 output's manifest names its run prefix; a local output (renamed into place) and
    a folder written by other means (a BEIR folder, hand-made pairs) are read as they are.
    """
    manifest = read_manifest(uri)
    prefix = (manifest or {}).get("manifest", {}).get("prefix") or ""
    if prefix:
        if ".." in prefix.split("/") or prefix.startswith("/"):
            raise storage.StorageError(f"bad prefix {prefix!r} in {uri}/{MANIFEST_FILE}")
        return storage.join(uri, prefix)
    return uri


def matching_manifest(uri: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest at ``uri`` when it is complete and was made with ``options``."""
    manifest = read_manifest(uri)
    if manifest is None:
        return None
    recorded = manifest.get("config") or {}
    same = all(recorded.get(key) == value for key, value in options.items())
    return manifest if same else None


# ------------------------------------------------------------------ one writer per output

# What a folder holds when it has no manifest naming its tool (files santa's jobs write).
_SIGNATURES = (
    ("a training run", ("checkpoint_manager_snapshot.json", "metrics.jsonl", "init_model")),
    ("a sweep", ("best.json",)),
    ("a pipeline run", ("report.md",)),
    ("evaluate", ("metrics.json",)),
    ("mine_negatives", ("negatives.parquet",)),
    ("export", ("config.json",)),
    ("index", ("index.faiss",)),
)
# santa's own bookkeeping: probes, the owner of a staging folder, the lock/lease.
_HIDDEN_PREFIXES = (".santa-probe-", OWNER_FILE, ".santa-lock")


def _entries(uri: str) -> list[str] | None:
    """Names directly under ``uri`` (None: nothing there)."""
    if storage.is_s3(uri):
        location = storage.open_location(uri)
        info = storage.file_info(location)
        if info.type == pafs.FileType.NotFound:
            return None
        if info.type == pafs.FileType.File:
            return [""]
        return [entry.path.rstrip("/").rsplit("/", 1)[-1] for entry in storage.list_dir(location)]
    path = storage.absolute(uri)
    if not os.path.lexists(path):
        return None
    if not os.path.isdir(path):
        return [""]
    return os.listdir(path)


def output_kind(uri: str) -> str | None:
    """Which job's output ``uri`` holds: a manifest's ``tool`` (``preprocess``,
    ``evaluate``, ...), a kind read from the files there (``a training run``, ``a sweep``),
    ``files santa did not write``, or None when it is missing or empty."""
    names = _entries(uri)
    if names is None:
        return None
    names = [name for name in names if name and not name.startswith(_HIDDEN_PREFIXES)] + [
        name for name in names if not name
    ]
    if not names:
        return None
    if names == [""]:
        return "a file"
    manifest = read_manifest(uri)
    if manifest is not None:
        if manifest.get(TOOL_KEY):
            return str(manifest[TOOL_KEY])
        if (manifest.get("config") or {}).get("dataset"):
            return "preprocess"  # published before manifests named their tool
    present = set(names)
    for kind, files in _SIGNATURES:
        if present & set(files) or (
            kind == "a training run" and any(n.startswith("checkpoint_") for n in present)
        ):
            return kind
    return "files santa did not write"


def check_output_owner(uri: str, tool: str, what: str = "--output") -> None:
    """Refuse (``ValueError``, one line) an output folder holding another job's output or
    files of unknown origin: publishing replaces the folder whole."""
    kind = output_kind(uri)
    if kind is None or kind == tool:
        return
    article = "" if kind.startswith(("a ", "an ", "files")) else "the output of "
    raise ValueError(
        f"{what} {uri} holds {article}{kind}; {tool} replaces its output folder whole, so it "
        "writes only into a new or empty folder or one it wrote before: pick another folder"
    )


@contextlib.contextmanager
def claim_output(uri: str, tool: str, what: str = "--output", force: bool = False):
    """One writer per output: the lease runs take (:mod:`santa.files.runlock`) on the
    output, and the folder checked to hold this tool's output or nothing."""
    from santa.files.layout import output_lock
    from santa.files.runlock import RunLock

    lock = RunLock(
        uri,
        force=force,
        description=f"ray_jobs.{tool}",
        lock_uri=output_lock(uri),
        what="output",
        hint=f"pick another {what}",
    )
    with lock:
        check_output_owner(uri, tool, what)
        yield lock
