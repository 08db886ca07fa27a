"""A local job's record (``<cluster>/jobs/<job>/job.json``) and the one mapping between it and the job's spec.

Every field of ``JobSpec`` is recorded under its camelCase name (``nodes`` as ``nodeCount``, the count it
started with: core/launched.py's keys, those `job show` prints), so an option added to the spec is recorded, read
back for a replacement node and shown by ``job show`` with no change here. A record written before a field existed
reads as the job ran then (``_BEFORE``), never as today's default.
"""
from __future__ import annotations

import time
from dataclasses import MISSING, fields
from typing import Any

from azext_elastictrain.core.launched import key as _key, spec_fields
from azext_elastictrain.core.spec import JobSpec

# What a job recorded before the field existed ran with, where that is not the spec's default: no warm starts.
_BEFORE: dict[str, Any] = {"warm_start": False}


def new_record(spec: JobSpec, *, cluster: str, script: str, rdzv_id: str) -> dict[str, Any]:
    """The record of a run of ``spec`` about to start (its nodes are added as each starts)."""
    return {**spec_fields(spec), "cluster": cluster, "created": time.time(), "script": script, "rdzvId": rdzv_id,
            "stopRequested": False, "nodes": []}


def spec_of(record: dict[str, Any]) -> JobSpec:
    """The spec a recorded job runs with: what a node that joins it later is started from."""
    def tupled(value: Any) -> Any:
        return tuple(tupled(v) for v in value) if isinstance(value, list) else value

    given = {}
    for f in fields(JobSpec):
        key = _key(f.name)
        if key in record:
            given[f.name] = tupled(record[key]) if isinstance(f.default, tuple) else record[key]
        elif f.name in _BEFORE:
            given[f.name] = _BEFORE[f.name]
        elif f.default is MISSING:
            raise KeyError(f"the record of job {record.get('name')!r} lacks {key!r}")
    return JobSpec(**given)
