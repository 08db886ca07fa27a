"""az elastictrain evict simulate: Spot evictions, with a notice first as Azure gives one."""
from __future__ import annotations

import time

from azext_elastictrain.operations._local import local_backend, local_errors, local_names


def simulate_eviction(cmd, job: str, local: bool = False, cluster: str | None = None, node: str | None = None,
                      count: int | None = None, notice_seconds: float = 30.0, replace_after: float | None = None,
                      wait: bool = False, dry_run: bool = False, yes: bool = False) -> dict:
    """Evict nodes of a running job; with --wait follow its recovery; with --replace-after bring
    the capacity back (after the recovery, when following it) and, with --wait, follow the job
    back to its full world size."""
    from azure.cli.core.azclierror import AzureResponseError
    from azure.cli.core.util import user_confirmation

    from azext_elastictrain.core.backends.local_evict import EvictionError

    backend = local_backend(cmd, local)
    cluster = local_names(cluster, job)
    options = dict(node=node, count=count, notice_seconds=notice_seconds, replace_after=replace_after)
    with local_errors(cluster, job):
        plan = backend.evict(cluster, job, dry_run=True, **options)
        if dry_run:
            return plan
        nodes = ", ".join(n["node"] for n in plan["nodes"])
        notice = f"after a {notice_seconds:g}s Preempt notice" if notice_seconds else "without notice"
        user_confirmation(f"Evict {nodes} of job {job!r} {notice}?", yes=yes)
        world_before = backend.show_job(cluster, job).get("worldSize")
        result = backend.evict(cluster, job, **options)
        try:
            if wait:
                result["recovery"] = [backend.follow_recovery(cluster, job, e) for e in result["evictions"]][-1:]
            if replace_after is not None:
                evicted_at = max(e["evictedAt"] for e in result["evictions"])
                time.sleep(max(0.0, evicted_at + replace_after - time.time()))
                result["replacements"] = backend.replace_nodes(cluster, job, len(result["evictions"]))
                if wait and world_before:
                    since = min(r["startedAt"] for r in result["replacements"])
                    result["capacityBack"] = backend.follow_world_size(cluster, job, world_before, since)
        except EvictionError as ex:
            raise AzureResponseError(str(ex), recommendation=f"See 'az elastictrain job logs --local "
                                                             f"--name {job}'.") from ex
        return result
