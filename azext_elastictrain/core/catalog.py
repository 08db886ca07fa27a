"""The checkpoint catalog of a job, and retention planning over it.

Reading is one listing of ``<job>/checkpoints/`` plus one small GET per
manifest. Planning is pure (``plan_prune``) so it can be shown before anything
is deleted, and tested exhaustively; ``apply_prune`` then deletes each
checkpoint's manifest first (un-committing it) and its files after, so a
reader never sees a half-deleted checkpoint as complete.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from azext_elastictrain.core import layout
from azext_elastictrain.core.blobstore import BlobEntry, IntegrityError, NotFound, StoreError
from azext_elastictrain.core.eventlog.view import iso_time

COMPLETE = "complete"
INCOMPLETE = "incomplete"  # no manifest: being written, or abandoned
DAMAGED = "damaged"  # manifest present, files missing or wrong size/checksum

# An incomplete checkpoint touched this recently may still be being written.
DEFAULT_GRACE_SECONDS = 600.0


class Store(Protocol):
    def list(self, prefix: str) -> list[BlobEntry]:
        ...

    def read(self, name: str) -> bytes:
        ...

    def download(self, name: str, size: int, sha256: str | None = None) -> memoryview:
        ...

    def delete(self, names: Sequence[str]) -> None:
        ...


@dataclass(frozen=True)
class Checkpoint:  # pylint: disable=too-many-instance-attributes  # the catalog's columns
    step: int
    status: str
    created: float
    size: int
    files: int
    world_size: int | None
    writer: str | None
    blobs: tuple[str, ...]  # every blob under the step folder, manifest included
    last_modified: float
    problems: tuple[str, ...] = ()
    verified: bool | None = None  # None: checksums not read
    manifest: layout.Manifest | None = field(default=None, compare=False, repr=False)

    @property
    def complete(self) -> bool:
        return self.status == COMPLETE

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "created": _iso(self.created),
            "sizeBytes": self.size,
            "files": self.files,
            "worldSize": self.world_size,
            "verified": self.verified,
            "problems": list(self.problems),
        }


def _iso(ts: float) -> str:
    return iso_time(ts) or ""


def list_checkpoints(store: Store, job_prefix: str) -> list[Checkpoint]:
    """Every checkpoint folder of the job, oldest first, with its status.

    Sizes are checked against the listing (cheap); checksums only by ``verify``.
    """
    by_step: dict[int, list[BlobEntry]] = {}
    for entry in store.list(layout.checkpoints_prefix(job_prefix)):
        step = layout.parse_step(entry.name, job_prefix)
        if step is not None:
            by_step.setdefault(step, []).append(entry)
    return [_describe(store, job_prefix, step, by_step[step]) for step in sorted(by_step)]


def _describe(store: Store, job_prefix: str, step: int, entries: list[BlobEntry]) -> Checkpoint:
    folder = layout.checkpoint_prefix(job_prefix, step)
    names = tuple(sorted(e.name for e in entries))
    newest = max(e.last_modified for e in entries)
    manifest_blob = layout.manifest_name(job_prefix, step)
    if manifest_blob not in names:
        return Checkpoint(
            status=INCOMPLETE, created=newest, size=sum(e.size for e in entries),
            files=len(entries), world_size=None, writer=None, step=step, blobs=names, last_modified=newest,
        )
    try:
        manifest = layout.Manifest.from_bytes(store.read(manifest_blob))
    except (layout.ManifestError, StoreError) as ex:
        return Checkpoint(
            status=DAMAGED, created=newest, size=sum(e.size for e in entries), files=len(entries),
            world_size=None, writer=None, problems=(str(ex),), step=step, blobs=names, last_modified=newest,
        )
    listed = {e.name[len(folder):]: e for e in entries}
    problems = []
    for f in manifest.files:
        entry = listed.get(f.path)
        if entry is None:
            problems.append(f"missing {f.path}")
        elif entry.size != f.size:
            problems.append(f"{f.path}: {entry.size} bytes, manifest says {f.size}")
        elif entry.sha256 and entry.sha256 != f.sha256:
            problems.append(f"{f.path}: stored checksum differs from the manifest")
    if manifest.step != step:
        problems.append(f"manifest is for step {manifest.step}")
    return Checkpoint(
        status=DAMAGED if problems else COMPLETE,
        created=manifest.created,
        size=manifest.total_bytes,
        files=len(manifest.files),
        world_size=manifest.world_size,
        writer=manifest.writer,
        problems=tuple(problems),
        manifest=manifest,
        step=step, blobs=names, last_modified=newest,
    )


def verify(store: Store, job_prefix: str, checkpoint: Checkpoint) -> Checkpoint:
    """Read every file a checkpoint's manifest names back and compare its checksum.

    Checkpoints without a manifest have nothing to verify against (verified stays None).
    """
    if checkpoint.manifest is None:
        return checkpoint
    folder = layout.checkpoint_prefix(job_prefix, checkpoint.step)
    problems = list(checkpoint.problems)
    for f in checkpoint.manifest.files:
        try:
            store.download(folder + f.path, f.size, f.sha256)
        except (IntegrityError, NotFound) as ex:
            if str(ex) not in problems:
                problems.append(str(ex))
    if problems:
        return _replace(checkpoint, status=DAMAGED, problems=tuple(problems), verified=False)
    return _replace(checkpoint, verified=True)


def _replace(checkpoint: Checkpoint, **changes: Any) -> Checkpoint:
    from dataclasses import replace

    return replace(checkpoint, **changes)


def newest_complete(checkpoints: Iterable[Checkpoint]) -> Checkpoint | None:
    complete = [c for c in checkpoints if c.complete]
    return complete[-1] if complete else None


@dataclass(frozen=True)
class PrunePlan:
    delete: tuple[Checkpoint, ...]
    keep: tuple[Checkpoint, ...]
    reasons: dict[int, str] = field(default_factory=dict)  # step -> why it goes

    @property
    def bytes_freed(self) -> int:
        return sum(c.size for c in self.delete)


def plan_prune(
    checkpoints: Sequence[Checkpoint],
    *,
    keep_last: int | None = None,
    older_than: float | None = None,
    incomplete: bool = False,
    now: float | None = None,
    grace: float = DEFAULT_GRACE_SECONDS,
) -> PrunePlan:
    """Which checkpoints to delete. Pure.

    - ``keep_last``: delete complete checkpoints beyond the newest N;
    - ``older_than``: delete complete checkpoints created more than that many seconds ago;
    - ``incomplete``: delete incomplete/damaged ones that are older than the newest
      complete checkpoint and untouched for ``grace`` seconds.

    Never deleted, whatever the options: the newest complete checkpoint, and
    anything that may still be being written (newer than it, or recently touched).
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError("keep_last must be at least 1: the newest complete checkpoint is always kept")
    now = time.time() if now is None else now
    ordered = sorted(checkpoints, key=lambda c: c.step)
    newest = newest_complete(ordered)
    complete = [c for c in ordered if c.complete]
    reasons: dict[int, str] = {}
    if keep_last is not None:
        for c in complete[:-keep_last]:
            reasons[c.step] = f"beyond the newest {keep_last}"
    if older_than is not None:
        for c in complete:
            if now - c.created > older_than:
                reasons.setdefault(c.step, f"older than {older_than:g}s")
    if incomplete and newest is not None:
        for c in ordered:
            if not c.complete and c.step < newest.step and now - c.last_modified > grace:
                reasons[c.step] = c.status
    if newest is not None:
        reasons.pop(newest.step, None)
    delete = tuple(c for c in ordered if c.step in reasons)
    keep = tuple(c for c in ordered if c.step not in reasons)
    return PrunePlan(delete=delete, keep=keep, reasons=reasons)


def apply_prune(store: Store, job_prefix: str, plan: PrunePlan) -> None:
    """Delete what the plan says: each manifest first, then the rest of its folder."""
    for c in plan.delete:
        manifest = layout.manifest_name(job_prefix, c.step)
        if manifest in c.blobs:
            store.delete([manifest])
    rest = [name for c in plan.delete for name in c.blobs if not name.endswith("/" + layout.MANIFEST)]
    if rest:
        store.delete(rest)


def orphan_blobs(checkpoint: Checkpoint, job_prefix: str) -> list[str]:
    """Blobs in a complete checkpoint's folder that its manifest does not cover.

    These are a losing writer's files (two trainings raced for the same step).
    """
    if checkpoint.manifest is None:
        return []
    folder = layout.checkpoint_prefix(job_prefix, checkpoint.step)
    covered = {folder + f.path for f in checkpoint.manifest.files}
    covered.add(layout.manifest_name(job_prefix, checkpoint.step))
    return [n for n in checkpoint.blobs if n not in covered]


def download(store: Store, job_prefix: str, checkpoint: Checkpoint, dest: Path) -> dict[str, Any]:
    """Copy a complete checkpoint into ``dest/<step:012d>/`` as a plain DCP folder, every file verified.

    The writer's folder level is dropped, so the result is what
    ``torch.distributed.checkpoint.FileSystemReader`` reads (``.metadata``,
    ``__*.distcp``) plus ``manifest.json``. Files land in a hidden folder
    first and are renamed into place once all are verified: an interrupted
    download leaves no folder that looks complete. An existing folder is
    never overwritten.
    """
    if not checkpoint.complete or checkpoint.manifest is None:
        raise StoreError(f"checkpoint of step {checkpoint.step} is {checkpoint.status}: only a complete "
                         "checkpoint can be downloaded")
    final = dest / layout.step_dir(checkpoint.step)
    if final.exists():
        raise FileExistsError(f"{final} already exists; choose another --dest or remove it")
    partial = dest / f".{layout.step_dir(checkpoint.step)}.partial-{os.getpid()}"
    folder = layout.checkpoint_prefix(job_prefix, checkpoint.step)
    writer = checkpoint.manifest.writer.strip("/") + "/"
    try:
        for f in checkpoint.manifest.files:
            local = partial / (f.path[len(writer):] if f.path.startswith(writer) else f.path)
            local.parent.mkdir(parents=True, exist_ok=True)
            with open(local, "wb") as out:
                out.write(store.download(folder + f.path, f.size, f.sha256))
        (partial / layout.MANIFEST).write_bytes(checkpoint.manifest.to_bytes())
        os.replace(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return dict(checkpoint.to_dict(), verified=True, path=str(final))
