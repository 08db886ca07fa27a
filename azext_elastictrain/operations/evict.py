"""az elastictrain evict simulate: Spot evictions, with a notice first as Azure gives one."""
from __future__ import annotations

from azext_elastictrain.operations._local import local_backend, local_errors, local_names


def simulate_eviction(cmd, job: str, local: bool = False, cluster: str | None = None, node: str | None = None,
                      count: int | None = None, notice_seconds: float = 30.0, replace_after: float | None = None,
                      wait: bool = False, dry_run: bool = False, yes: bool = False) -> dict:
    """Evict nodes of a running job; optionally bring capacity back and follow the recovery."""
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
        result = backend.evict(cluster, job, **options)
        if wait:
            try:
                result["recovery"] = [backend.follow_recovery(cluster, job, e) for e in result["evictions"]][-1:]
            except EvictionError as ex:
                raise AzureResponseError(str(ex), recommendation=f"See 'az elastictrain job logs --local "
                                                                 f"--name {job}'.") from ex
        return result
