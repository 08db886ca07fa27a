"""az elastictrain job: run, list, show, logs, wait and delete elastic jobs.

Thin: validate, call the backend, map its errors to az error types. A job's
progress comes from its event log (core.events), never from torch.
"""
from __future__ import annotations

import shlex
import sys
import time

from azure.cli.core.azclierror import (
    InvalidArgumentValueError,
    UnclassifiedUserFault,
)

from azext_elastictrain.operations._local import local_backend, local_errors, local_names

WAIT_INTERVAL = 1.0


def run_job(cmd, name: str, script: str, min_nodes: int, max_nodes: int, local: bool = False,
            cluster: str | None = None, script_args: str | None = None, nodes: int | None = None,
            nproc_per_node: int = 1, checkpoint_interval: int | None = None, keep: int = 3) -> dict:
    """Validate everything, then start the job's nodes (torchrun agents) in the background."""
    from azext_elastictrain.core.spec import JobSpec

    backend = local_backend(cmd, local)
    cluster = local_names(cluster)
    try:
        args = tuple(shlex.split(script_args or ""))
    except ValueError as ex:
        raise InvalidArgumentValueError(
            f"--script-args {script_args!r} does not parse: {ex}",
            recommendation='Quote it as one argument: --script-args "--steps 300 --lr 0.05".',
        ) from ex
    spec = JobSpec(name=name, script=script, min_nodes=min_nodes, max_nodes=max_nodes, nodes=nodes,
                   nproc_per_node=nproc_per_node, script_args=args, checkpoint_interval=checkpoint_interval,
                   keep=keep, cluster=cluster)
    with local_errors(cluster, name):
        return backend.run_job(spec)


def list_jobs(cmd, local: bool = False, cluster: str | None = None) -> list[dict]:
    backend = local_backend(cmd, local)
    cluster = local_names(cluster)
    with local_errors(cluster):
        return backend.list_jobs(cluster)


def show_job(cmd, name: str, local: bool = False, cluster: str | None = None) -> dict:
    backend = local_backend(cmd, local)
    cluster = local_names(cluster, name)
    with local_errors(cluster, name):
        return backend.show_job(cluster, name)


def job_logs(cmd, name: str, local: bool = False, cluster: str | None = None, node: str | None = None,
             follow: bool = False, tail: int | None = None, timeout: int | None = None) -> None:
    """Print the nodes' logs (each line prefixed with its node when there are several)."""
    backend = local_backend(cmd, local)
    cluster = local_names(cluster, name)
    if tail is not None and tail < 0:
        raise InvalidArgumentValueError(f"--tail {tail} is negative", recommendation="Pass a line count >= 0.")
    if timeout is not None and timeout <= 0:
        raise InvalidArgumentValueError(f"--timeout {timeout} must be positive",
                                        recommendation="Pass seconds, e.g. --timeout 600.")
    with local_errors(cluster, name):
        prefix = node is None and len(backend.job_nodes(cluster, name)) > 1
        lines = backend.job_logs(cluster, name, node=node, tail=tail, follow=follow, timeout=timeout)
        try:
            for node_name, line in lines:
                sys.stdout.write(f"{node_name} | {line}\n" if prefix else line + "\n")
                if follow:
                    sys.stdout.flush()
        except KeyboardInterrupt:  # Ctrl-C ends --follow; the job goes on
            pass
        except BrokenPipeError:  # | head
            pass
        finally:
            try:
                sys.stdout.flush()
            except BrokenPipeError:
                pass


def wait_job(cmd, name: str, local: bool = False, cluster: str | None = None, state: str | None = None,
             step: int | None = None, world_size: int | None = None, timeout: int = 600) -> dict:
    """Poll the job until it is in ``state`` (default Succeeded), reached ``step`` and/or trains at
    ``world_size``; fail when it ends without getting there or time runs out."""
    from azext_elastictrain.core import events

    backend = local_backend(cmd, local)
    cluster = local_names(cluster, name)
    if step is not None and step < 0:
        raise InvalidArgumentValueError(f"--step {step} is negative", recommendation="Pass a step >= 0.")
    if world_size is not None and world_size < 1:
        raise InvalidArgumentValueError(f"--world-size {world_size} must be at least 1",
                                        recommendation="Pass the number of ranks to wait for, e.g. 2.")
    if timeout <= 0:
        raise InvalidArgumentValueError(f"--timeout {timeout} must be positive",
                                        recommendation="Pass seconds, e.g. --timeout 600.")
    if state is None and step is None and world_size is None:
        state = events.SUCCEEDED
    want = " and ".join(filter(None, [state and f"state {state}", step is not None and f"step {step}",
                                      world_size is not None and f"world size {world_size}"]))
    logs = f"az elastictrain job logs --local --cluster {cluster} --name {name} --tail 50"
    deadline = time.monotonic() + timeout
    with local_errors(cluster, name):
        while True:
            shown = backend.show_job(cluster, name)
            now, at = shown["state"], shown.get("step")
            reached = (step is None or (at is not None and at >= step)) and \
                (world_size is None or (now == events.RUNNING and shown.get("worldSize") == world_size))
            if (state is None or now == state) and reached:
                return shown
            where = f"at step {at}" if at is not None else "before its first step"
            terminal = now in (events.SUCCEEDED, events.FAILED, events.STOPPED)
            if terminal and (state is None or now != state or not reached):
                raise UnclassifiedUserFault(
                    f"job {name!r} is {now} {where}: it will not reach {want}",
                    recommendation=f"See what happened with '{logs}'." if now != events.SUCCEEDED else
                    "Wait for a state or step it can still reach.",
                )
            if time.monotonic() >= deadline:
                size = f", world size {shown['worldSize']}" if shown.get("worldSize") else ""
                raise UnclassifiedUserFault(
                    f"timed out after {timeout}s waiting for job {name!r} to reach {want}: "
                    f"it is {now} {where}{size}",
                    recommendation=f"Wait longer with --timeout, or look at its progress with '{logs}'.",
                )
            time.sleep(WAIT_INTERVAL)


def delete_job(cmd, name: str, local: bool = False, cluster: str | None = None, yes: bool = False,
               dry_run: bool = False, delete_checkpoints: bool = False) -> dict:
    """Stop every node (agent and all descendants, checked by pid) and remove the job's state.

    Checkpoints stay unless --delete-checkpoints: losing them by accident is the worst outcome.
    """
    from azure.cli.core.util import user_confirmation

    backend = local_backend(cmd, local)
    cluster = local_names(cluster, name)
    with local_errors(cluster, name):
        plan = backend.delete_job(cluster, name, dry_run=True, delete_checkpoints=delete_checkpoints)
        if dry_run:
            return plan
        pids = ", ".join(f"{p['node'] or 'worker'} (pid {p['pid']})" for p in plan["stopped"]) or "no running processes"
        checkpoints = (f"DELETE its {plan['blobsDeleted']} checkpoint and event blobs "
                       f"({plan['bytesFreed'] / 2**20:.1f} MiB)" if delete_checkpoints
                       else "keep its checkpoints")
        user_confirmation(f"Delete job {name!r} of local cluster {cluster!r}: stop {pids}, remove its state "
                          f"and {checkpoints}?", yes=yes)
        return backend.delete_job(cluster, name, delete_checkpoints=delete_checkpoints)
