"""Where a job's data lives in blob storage, and the checkpoint manifest schema.

Shared by the CLI (catalog, prune) and the training runtime, so both agree on
one layout::

    <job>/checkpoints/<step:012d>/<writer>/...    DCP files of one save attempt
    <job>/checkpoints/<step:012d>/manifest.json   written LAST: the commit
    <job>/events.jsonl                            append blob of progress events

Every save attempt writes its files under its own random ``<writer>`` folder,
so two trainings that (wrongly) write the same job and step never mix files:
whoever commits the manifest first wins, and the manifest names the files it
covers. Pure module: no I/O, no SDK imports.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

FORMAT_VERSION = 1
FORMAT_NAME = "torch-dcp"
# Every file's checksum: SHA-256 over the SHA-256 digests of its consecutive
# 8 MiB blocks, so writers and readers hash blocks in parallel (core.blobstore).
CHECKSUM = "sha256-of-8MiB-block-sha256"
CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
STEP_DIGITS = 12

# fullmatch, and [0-9] not \d: "$" would accept a trailing newline, \d other scripts' digits.
_STEP_DIR = re.compile(r"[0-9]{%d}" % STEP_DIGITS)
_JOB_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class ManifestError(ValueError):
    """A manifest that does not parse or does not describe a checkpoint."""


def validate_job_name(name: str) -> str:
    """Job names become blob prefixes and Kubernetes names: DNS labels."""
    if not _JOB_NAME.fullmatch(name or ""):
        raise ValueError(
            f"invalid job name {name!r}: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return name


def step_dir(step: int) -> str:
    if step < 0 or step >= 10**STEP_DIGITS:
        raise ValueError(f"step {step} is out of range")
    return f"{step:0{STEP_DIGITS}d}"


def join(*parts: str) -> str:
    """Join blob path parts, ignoring empty ones (a job prefix may be '')."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def checkpoints_prefix(job_prefix: str) -> str:
    return join(job_prefix, CHECKPOINTS) + "/"


def checkpoint_prefix(job_prefix: str, step: int) -> str:
    return join(job_prefix, CHECKPOINTS, step_dir(step)) + "/"


def manifest_name(job_prefix: str, step: int) -> str:
    return join(job_prefix, CHECKPOINTS, step_dir(step), MANIFEST)


def writer_prefix(job_prefix: str, step: int, writer: str) -> str:
    return join(job_prefix, CHECKPOINTS, step_dir(step), writer) + "/"


def events_name(job_prefix: str) -> str:
    return join(job_prefix, EVENTS)


def parse_step(blob_name: str, job_prefix: str) -> int | None:
    """The step a blob under ``<job>/checkpoints/`` belongs to, else None."""
    prefix = checkpoints_prefix(job_prefix)
    if not blob_name.startswith(prefix):
        return None
    head = blob_name[len(prefix):].split("/", 1)[0]
    return int(head) if _STEP_DIR.fullmatch(head) else None


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint, relative to the step folder."""

    path: str
    size: int
    sha256: str  # base64 block-list checksum, see core.blobstore.checksum

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class Manifest:  # pylint: disable=too-many-instance-attributes  # the manifest.json fields
    """The commit record of one checkpoint: it exists iff this was written."""

    step: int
    created: float  # epoch seconds
    world_size: int
    writer: str
    files: tuple[FileEntry, ...]
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_bytes(self) -> bytes:
        doc = {
            "format": self.format,
            "format_version": self.format_version,
            "step": self.step,
            "created": self.created,
            "world_size": self.world_size,
            "writer": self.writer,
            "total_bytes": self.total_bytes,
            "checksum": CHECKSUM,
            "files": [f.to_json() for f in self.files],
            "extra": self.extra,
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
        try:
            doc = json.loads(data)
            files = tuple(
                FileEntry(path=str(f["path"]), size=int(f["size"]), sha256=str(f["sha256"]))
                for f in doc["files"]
            )
            manifest = cls(
                step=int(doc["step"]),
                created=float(doc["created"]),
                world_size=int(doc["world_size"]),
                writer=str(doc["writer"]),
                files=files,
                format=str(doc["format"]),
                format_version=int(doc["format_version"]),
                extra=dict(doc.get("extra") or {}),
            )
        except (ValueError, KeyError, TypeError) as ex:
            raise ManifestError(f"unreadable checkpoint manifest: {ex}") from ex
        if doc.get("checksum", CHECKSUM) != CHECKSUM:
            raise ManifestError(f"unsupported checksum {doc.get('checksum')!r}")
        if manifest.format != FORMAT_NAME or manifest.format_version > FORMAT_VERSION:
            raise ManifestError(
                f"unsupported checkpoint format {manifest.format} v{manifest.format_version}"
            )
        if not files or any(f.path.startswith("/") or ".." in f.path.split("/") for f in files):
            raise ManifestError("manifest lists no files or a path outside its checkpoint")
        return manifest


def manifest_files(entries: Iterable[FileEntry]) -> tuple[FileEntry, ...]:
    """Files in a stable order so manifests compare equal across writers."""
    return tuple(sorted(entries, key=lambda f: f.path))
