"""az elastictrain evict simulate: Spot evictions, with a notice first as Azure gives one.

``-g RG -c CLUSTER``: real Spot evictions of AKS nodes through the VMSS simulateEviction API.
``--local``: a Scheduled Events Preempt notice, then the node's processes go, on the local cluster.

One function: resolve the cluster (``_validators``), plan, confirm, evict through its ``Backend``.
``--schedule``: evictions at a rate for a duration (``core.chaos``), each one's recovery printed as it comes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from azext_elastictrain._errors import az_errors
from azext_elastictrain._validators import resolve_eviction, resolve_schedule

if TYPE_CHECKING:
    from azext_elastictrain._validators import Target
    from azext_elastictrain.backends.base import ScheduleRequest
    from azext_elastictrain.backends.views import Evicted, ScheduleRun


# pylint: disable-next=too-many-locals  # one parameter per option of the command
def simulate_eviction(cmd: Any, *, job: str | None = None, local: bool = False, cluster: str | None = None,
                      node: str | None = None, count: int | None = None, notice_seconds: float | None = None,
                      replace_after: float | None = None, wait: bool = False, dry_run: bool = False,
                      yes: bool = False, resource_group_name: str | None = None, rank: int | None = None,
                      pool: str | None = None, schedule: bool = False, rate: float | None = None,
                      duration: float | None = None, notice_share: float | None = None,
                      seed: int | None = None) -> Mapping[str, Any] | Evicted | ScheduleRun:
    """Evict nodes of a running job; with --wait follow its recovery; with --replace-after (local) bring
    the capacity back (after the recovery, when following it) and, with --wait, follow the job
    back to its full world size."""
    from azure.cli.core.util import user_confirmation

    from azext_elastictrain.backends.base import EvictionRequest

    target = resolve_eviction(local=local, resource_group=resource_group_name, cluster=cluster, job=job)
    with az_errors(target, job=job):
        chaos = resolve_schedule(schedule=schedule, job=job, rate=rate, duration=duration, notice_share=notice_share,
                                 notice_seconds=notice_seconds, replace_after=replace_after, seed=seed, node=node,
                                 count=count, rank=rank, pool=pool, wait=wait)
    if chaos is not None:
        return _run_schedule(cmd, target, chaos, dry_run=dry_run, yes=yes)
    request = EvictionRequest(job=job, node=node, rank=rank, pool=pool, count=count, notice_seconds=notice_seconds,
                              replace_after=replace_after)
    with az_errors(target, job=job), target.opened(cmd) as backend:
        plan = backend.plan_eviction(request)
        if dry_run:
            return plan.shown
        user_confirmation(plan.prompt, yes=yes)
        return backend.evict(plan, wait=wait)


def _run_schedule(cmd: Any, target: Target, request: ScheduleRequest, *, dry_run: bool,
                  yes: bool) -> Mapping[str, Any] | ScheduleRun:
    """Plan the schedule, confirm, carry it out; Ctrl-C ends it between steps with the report so far."""
    import sys

    from azure.cli.core.util import user_confirmation

    from azext_elastictrain.core.chaos import stop_on_interrupt

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with az_errors(target, job=request.job), target.opened(cmd) as backend:
        plan = backend.plan_schedule(request)
        if dry_run:
            return plan.shown
        user_confirmation(plan.prompt, yes=yes)
        say(f"schedule seed {plan.shown['seed']}: {len(plan.shown['evictions'])} evictions, one every "
            f"{plan.shown['intervalSeconds']:g}s (Ctrl-C stops it and prints what was seen)")
        with stop_on_interrupt() as stop:
            return backend.run_schedule(plan, stop=stop, say=say)
