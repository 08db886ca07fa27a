"""How a job was launched, as `job show` prints it: every option of its spec, where it checkpoints and its
rendezvous, made here for both backends so that a job shows the same keys on either (tests/unit/
test_backend_contract.py).

Every field of ``JobSpec`` is shown under its camelCase name (``nodes`` as ``nodeCount``, the count it started
with), so an option added to the spec is shown on both backends with no change here but its key in ``Launched``
(for the type checker; a test holds that type to the spec's fields). The local backend records a
job under the same names (backends/local/record.py) and shows the spec it reads back; the AKS backend reads the
spec back from the job's manifest, as far as it can (backends/aks/describe.py). What only one backend has (local:
an in-process job's coordinator; AKS: the image) it adds as its ``own``.

Pure and stdlib only.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping, TypedDict, cast

from azext_elastictrain.core.launch import RECOVERY_IN_PROCESS
from azext_elastictrain.core.spec import JobSpec

# Field -> key where it is not the camelCase of the name.
_KEYS = {"nodes": "nodeCount"}


def key(name: str) -> str:
    """The key of ``JobSpec``'s field ``name``, in a local job's record and in `job show`."""
    head, *rest = name.split("_")
    return _KEYS.get(name) or head + "".join(part.title() for part in rest)


def spec_fields(spec: JobSpec | Mapping[str, Any]) -> dict[str, Any]:
    """The spec's fields under their keys, as JSON holds them (tuples become lists); ``nodeCount`` is the count the
    job started with. A mapping of field names stands for a spec that could not be made whole (a job made by an
    older version or another tool): what it lacks is None."""
    def plain(value: Any) -> Any:
        return [plain(v) for v in value] if isinstance(value, tuple) else value

    if isinstance(spec, JobSpec):
        values = {f.name: getattr(spec, f.name) for f in fields(JobSpec)}
        values["nodes"] = spec.node_count
    else:
        values = {f.name: spec.get(f.name) for f in fields(JobSpec)}
    return {key(name): plain(value) for name, value in values.items()}


class Coordinator(TypedDict):
    """A local in-process job's coordinator process."""

    address: str | None
    pid: int
    alive: bool
    log: str


class LaunchedOwn(TypedDict, total=False):
    """What only one backend's launched part shows: a local in-process job's coordinator; an AKS job's image."""

    coordinator: Coordinator
    image: str | None


class Launched(LaunchedOwn):
    """The launched part of `job show`: one key per field of ``JobSpec`` but its name (``key``), in the spec's
    order (a field the spec could not be read back with is None), between when it was created and where it
    checkpoints. tests/unit/test_backend_contract.py holds it to ``JobSpec``'s fields."""

    created: str | None
    script: str | None
    minNodes: int | None
    maxNodes: int | None
    nodeCount: int | None
    nprocPerNode: int | None
    scriptArgs: list[str] | None
    checkpointInterval: int | None
    checkpointIntervalSeconds: float | None
    keep: int | None
    memoryTier: str | None
    warmStart: bool | None
    recovery: str | None
    env: list[str] | None
    checkpointUrl: str | None
    rdzvId: str | None


def launched(spec: JobSpec | Mapping[str, Any], *, created: str | None, checkpoint_url: str | None,
             rdzv_id: str | None, own: LaunchedOwn | None = None) -> Launched:
    """The launched part of `job show`: when the job was created, every option of ``spec`` but its name, where it
    checkpoints, its rendezvous (none in process: each node is a world of its own), then the backend's ``own``."""
    shown = spec_fields(spec)
    in_process = shown["recovery"] == RECOVERY_IN_PROCESS
    del shown["name"]
    # One key per spec field, by the loop (an option added to the spec is shown with no change here); the type
    # names them for the checker, and tests/unit/test_backend_contract.py holds it to the spec's fields.
    return cast(Launched, {"created": created, **shown, "checkpointUrl": checkpoint_url,
                           "rdzvId": None if in_process else rdzv_id, **(own or {})})
