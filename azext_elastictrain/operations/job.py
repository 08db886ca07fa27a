"""az elastictrain job: run, list, show, logs, wait and delete elastic jobs, on a local cluster (--local) or on
AKS (-g RG -c CLUSTER).

Thin: validate, call the backend, map its errors to az error types. A job's
progress comes from its event log (core.events), never from torch.
"""
from __future__ import annotations

import shlex
import sys
import time

from azure.cli.core.azclierror import (
    ArgumentUsageError,
    InvalidArgumentValueError,
    MutuallyExclusiveArgumentError,
    RequiredArgumentMissingError,
    UnclassifiedUserFault,
)

from azext_elastictrain.operations._aks_jobs import aks_job_errors, aks_jobs, on_aks
from azext_elastictrain.operations._local import local_backend, local_errors, local_names

WAIT_INTERVAL = 1.0
AKS_WAIT_INTERVAL = 10.0  # each look asks ARM, Kubernetes and blob storage


def run_job(cmd, name: str, script: str, min_nodes: int, max_nodes: int, local: bool = False,
            cluster: str | None = None, script_args: str | None = None, nodes: int | None = None,
            nproc_per_node: int | None = None, checkpoint_interval: int | None = None, keep: int = 3,
            resource_group_name: str | None = None, image: str | None = None, gpus_per_node: int | None = None,
            dry_run: bool = False) -> dict:
    """Validate everything, then start the job: torchrun agents here (--local), or an ElasticJob on AKS."""
    from azext_elastictrain.core.spec import JobSpec

    aks = on_aks(local, resource_group_name, cluster)
    if not aks and (image or gpus_per_node is not None or dry_run):
        raise ArgumentUsageError("--image, --gpus-per-node and --dry-run are for a job on AKS (-g RG -c CLUSTER)",
                                 recommendation="A local job runs the script of this checkout: drop them.")
    if aks and not image:
        raise RequiredArgumentMissingError(
            "a job on AKS needs --image: the container image with torch and the training script",
            recommendation="Pass a pinned image, e.g. --image myregistry.azurecr.io/train:1.0 "
                           "(see scripts/Dockerfile).")
    try:
        args = tuple(shlex.split(script_args or ""))
    except ValueError as ex:
        raise InvalidArgumentValueError(
            f"--script-args {script_args!r} does not parse: {ex}",
            recommendation='Quote it as one argument: --script-args "--steps 300 --lr 0.05".',
        ) from ex
    if aks:
        gpus = 1 if gpus_per_node is None else gpus_per_node
        if gpus < 1:
            raise InvalidArgumentValueError(f"--gpus-per-node must be a whole number of at least 1, not {gpus}",
                                            recommendation="Pass the GPUs each worker pod gets, e.g. 1.")
        spec = JobSpec(name=name, script=script, min_nodes=min_nodes, max_nodes=max_nodes, nodes=nodes,
                       nproc_per_node=gpus if nproc_per_node is None else nproc_per_node, script_args=args,
                       checkpoint_interval=checkpoint_interval, keep=keep)
        with aks_job_errors(resource_group_name, cluster):
            return aks_jobs(cmd, storage=not dry_run).run_job(resource_group_name, cluster, spec, image,
                                                               gpus_per_node=gpus, dry_run=dry_run)
    backend = local_backend(cmd, local)
    cluster = local_names(cluster)
    spec = JobSpec(name=name, script=script, min_nodes=min_nodes, max_nodes=max_nodes, nodes=nodes,
                   nproc_per_node=1 if nproc_per_node is None else nproc_per_node, script_args=args,
                   checkpoint_interval=checkpoint_interval, keep=keep, cluster=cluster)
    with local_errors(cluster, name):
        return backend.run_job(spec)


def list_jobs(cmd, local: bool = False, cluster: str | None = None,
              resource_group_name: str | None = None) -> list[dict]:
    if on_aks(local, resource_group_name, cluster):
        with aks_job_errors(resource_group_name, cluster):
            return aks_jobs(cmd).list_jobs(resource_group_name, cluster)
    backend = local_backend(cmd, local)
    cluster = local_names(cluster)
    with local_errors(cluster):
        return backend.list_jobs(cluster)


def show_job(cmd, name: str, local: bool = False, cluster: str | None = None,
             resource_group_name: str | None = None) -> dict:
    if on_aks(local, resource_group_name, cluster):
        with aks_job_errors(resource_group_name, cluster):
            return aks_jobs(cmd).show_job(resource_group_name, cluster, name)
    backend = local_backend(cmd, local)
    cluster = local_names(cluster, name)
    with local_errors(cluster, name):
        return backend.show_job(cluster, name)


def job_logs(cmd, name: str, local: bool = False, cluster: str | None = None, node: str | None = None,
             follow: bool = False, tail: int | None = None, timeout: int | None = None,
             resource_group_name: str | None = None, rank: int | None = None, pod: str | None = None) -> None:
    """Print the nodes' logs (each line prefixed with its node, or pod, when there are several)."""
    aks = on_aks(local, resource_group_name, cluster)
    if tail is not None and tail < 0:
        raise InvalidArgumentValueError(f"--tail {tail} is negative", recommendation="Pass a line count >= 0.")
    if timeout is not None and timeout <= 0:
        raise InvalidArgumentValueError(f"--timeout {timeout} must be positive",
                                        recommendation="Pass seconds, e.g. --timeout 600.")
    if aks:
        if node is not None:
            raise ArgumentUsageError("--node names a node of a local job; on AKS pick a worker with --rank or --pod",
                                     recommendation="'az elastictrain job show' lists the job's pods and ranks.")
        if rank is not None and pod is not None:
            raise MutuallyExclusiveArgumentError("pass --rank or --pod, not both")
        with aks_job_errors(resource_group_name, cluster):
            streams = aks_jobs(cmd, storage=False).log_streams(resource_group_name, cluster, name, rank=rank,
                                                               pod=pod, follow=follow, tail=tail)
            _print(_merged(streams, follow, timeout), prefix=len(streams) > 1, follow=follow)
        return
    if rank is not None or pod is not None:
        raise ArgumentUsageError("--rank and --pod pick a worker of a job on AKS; a local job's are --node",
                                 recommendation="'az elastictrain job show --local' lists its nodes.")
    backend = local_backend(cmd, local)
    cluster = local_names(cluster, name)
    with local_errors(cluster, name):
        prefix = node is None and len(backend.job_nodes(cluster, name)) > 1
        lines = backend.job_logs(cluster, name, node=node, tail=tail, follow=follow, timeout=timeout)
        _print(lines, prefix=prefix, follow=follow)


def _print(lines, *, prefix: bool, follow: bool) -> None:
    """``(source, line)`` pairs to stdout, until they end, Ctrl-C, or a closed pipe."""
    try:
        for source, line in lines:
            sys.stdout.write(f"{source} | {line}\n" if prefix else line + "\n")
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


def _merged(streams: list, follow: bool, timeout: int | None):
    """``(label, line)`` from every stream: one after the other, or, followed, as the lines come (until every
    stream ended or ``timeout`` seconds passed)."""
    if not follow:
        for label, lines in streams:
            for line in lines:
                yield label, line
        return
    import queue
    import threading

    arrived: queue.Queue = queue.Queue()
    done = object()

    def pump(label, lines) -> None:
        try:
            for line in lines:
                arrived.put((label, line))
        except Exception as ex:  # noqa: BLE001 - one pod's broken stream must not end the others
            arrived.put((label, f"<log stream ended: {ex}>"))
        finally:
            arrived.put(done)

    for label, lines in streams:
        threading.Thread(target=pump, args=(label, lines), daemon=True, name=f"log-{label}").start()
    deadline = None if timeout is None else time.monotonic() + timeout
    open_streams = len(streams)
    while open_streams:
        try:
            item = arrived.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return  # --timeout passed
        if item is done:
            open_streams -= 1
        else:
            yield item


def wait_job(cmd, name: str, local: bool = False, cluster: str | None = None, state: str | None = None,
             step: int | None = None, world_size: int | None = None, timeout: int = 600,
             resource_group_name: str | None = None) -> dict:
    """Poll the job until it is in ``state`` (default Succeeded), reached ``step`` and/or trains at
    ``world_size``; fail when it ends without getting there or time runs out."""
    from azext_elastictrain.core import events

    aks = on_aks(local, resource_group_name, cluster)
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
    if aks:
        jobs = aks_jobs(cmd)
        errors, interval = aks_job_errors(resource_group_name, cluster), AKS_WAIT_INTERVAL
        logs = f"az elastictrain job logs -g {resource_group_name} -c {cluster} --name {name} --tail 50"

        def show() -> dict:
            return jobs.show_job(resource_group_name, cluster, name)
    else:
        backend = local_backend(cmd, local)
        cluster = local_names(cluster, name)
        errors, interval = local_errors(cluster, name), WAIT_INTERVAL
        logs = f"az elastictrain job logs --local --cluster {cluster} --name {name} --tail 50"

        def show() -> dict:
            return backend.show_job(cluster, name)
    deadline = time.monotonic() + timeout
    with errors:
        while True:
            shown = show()
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
            time.sleep(interval)


def delete_job(cmd, name: str, local: bool = False, cluster: str | None = None, yes: bool = False,
               dry_run: bool = False, delete_checkpoints: bool = False, resource_group_name: str | None = None) -> dict:
    """Stop every node (agent and all descendants, checked by pid) and remove the job's state; on AKS delete
    the ElasticJob, whose pods go with it.

    Checkpoints stay unless --delete-checkpoints (local only): losing them by accident is the worst outcome.
    """
    from azure.cli.core.util import user_confirmation

    if on_aks(local, resource_group_name, cluster):
        if delete_checkpoints:
            raise ArgumentUsageError(
                "--delete-checkpoints is for local jobs: on AKS the checkpoints stay in the cluster's storage",
                recommendation=f"Prune them with 'az elastictrain checkpoint prune -g {resource_group_name} "
                               f"-c {cluster} --job {name}'.")

        def confirm(plan: dict) -> None:
            pods = ", ".join(p["pod"] for p in plan["stopped"]) or "no pods"
            user_confirmation(f"Delete job {name!r} of AKS cluster {cluster!r}: the ElasticJob and its pods "
                              f"({pods}); its checkpoints stay?", yes=yes)

        with aks_job_errors(resource_group_name, cluster):
            return aks_jobs(cmd, storage=False).delete_job(resource_group_name, cluster, name, dry_run=dry_run,
                                                           confirm=confirm)
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
