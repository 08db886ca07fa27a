"""az elastictrain job: run, list, show, logs, wait and delete elastic jobs, on a local cluster (--local) or on
AKS (-g RG -c CLUSTER).

One function per command: check the arguments, resolve where the job runs (``_validators``), call that
``Backend``; its errors leave through ``_errors``. A job's progress comes from its event log, never from torch.
"""
from __future__ import annotations

import shlex
import sys
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from azure.cli.core.azclierror import InvalidArgumentValueError

from azext_elastictrain._errors import az_errors
from azext_elastictrain._validators import resolve_target
from azext_elastictrain.core import launch

if TYPE_CHECKING:
    from azext_elastictrain._validators import Target
    from azext_elastictrain.backends.base import AnyBackend, JobShown
    from azext_elastictrain.backends.views import JobDeleted
    from azext_elastictrain.clients.prices import RetailPrices
    from azext_elastictrain.core.spec import JobSpec


def run_job(cmd: Any, *, name: str, script: str, min_nodes: int, max_nodes: int, local: bool = False,
            cluster: str | None = None, script_args: str | None = None, nodes: int | None = None,
            nproc_per_node: int | None = None, checkpoint_interval: int | None = None,
            checkpoint_interval_seconds: float | None = None, keep: int | None = None,
            resource_group_name: str | None = None, image: str | None = None, gpus_per_node: int | None = None,
            dry_run: bool = False, engine: str | None = None, memory_tier: str | None = None,
            warm_start: bool = True, recovery: str | None = None,
            env: list[str] | None = None) -> Mapping[str, Any] | JobShown:
    """Validate everything, then start the job: torchrun agents here (--local), or on AKS an ElasticJob
    (--engine torchelastic, the default) or a batch/v1 Indexed Job (--engine k8s-job)."""
    target = resolve_target(local=local, resource_group=resource_group_name, cluster=cluster, job=name)
    with az_errors(target, job=name):  # the spec checks itself as it is built, before the backend is opened
        recovery = _recovery_for(target, script, recovery)
        spec = _job_spec(target, script_args=script_args, gpus_per_node=gpus_per_node,
                         nproc_per_node=nproc_per_node, memory_tier=memory_tier, name=name, script=script,
                         min_nodes=min_nodes, max_nodes=max_nodes, nodes=nodes,
                         checkpoint_interval=checkpoint_interval,
                         checkpoint_interval_seconds=checkpoint_interval_seconds, keep=keep,
                         warm_start=warm_start is not False,
                         env=tuple(env or ()), recovery=recovery)
    _warn_default_group_timeout(spec)
    return _plan_and_submit(cmd, target, spec, image=image, gpus_per_node=gpus_per_node, engine=engine,
                            dry_run=dry_run)


def _recovery_for(target: Target, script: str, asked: str | None) -> str:
    """The job's recovery mode: the one asked for, else the backend's default (core/launch.py). The in-process
    mode runs only the runtime's loop (``ckpt.batches()``/``ckpt.steps()``): a script this machine can read that
    loops by hand (``ckpt.step()``) is refused when in-process was asked for, and runs in the restart mode, with
    a warning, when in-process is only the default (core/script_check.py)."""
    from azext_elastictrain.core.script_check import hand_written_loop
    from azext_elastictrain.core.spec import SpecError

    mode = asked or launch.PROFILES[target.kind].default_recovery
    if mode != launch.RECOVERY_IN_PROCESS:
        return mode
    line = hand_written_loop(_source_here(script))
    if line is None:
        return mode
    why = (f"{script} loops by hand (ckpt.step() at line {line}, no ckpt.batches() or ckpt.steps() loop): "
           "the in-process mode keeps the nodes in step at the runtime loop's step boundary, and refuses "
           "ckpt.step()")
    if asked:
        raise SpecError(f"{why}. Loop with `for step, batch in ckpt.batches(state, loader, epochs=E)` "
                        "(docs/runtime.md), or run the job with --recovery restart")
    from knack.log import get_logger

    get_logger(__name__).warning("%s; this job runs in --recovery restart (the mode for a loop of its own). "
                                 "Loop with ckpt.batches() to run in process.", why)
    return launch.RECOVERY_RESTART


def _source_here(script: str) -> str:
    """The script's text where this machine can read it (a local job's; an AKS job's path when it is here too),
    else "" (a path in the job's image: nothing to see)."""
    from pathlib import Path

    try:
        return Path(script).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return ""


def _warn_default_group_timeout(spec: JobSpec) -> None:
    """Restart mode, a script this machine can read (a local job's; an AKS job's path when it is here too): warn
    when it calls init_process_group without a timeout. The runtime's peer watch bounds a vanish once the script
    created its Checkpointer; before that only the script's own timeout does (core/script_check.py)."""
    from pathlib import Path

    from azext_elastictrain.core.script_check import init_without_timeout

    if spec.in_process:
        return  # the script's group is the node's own world: no remote peer can vanish from it
    try:
        lines = init_without_timeout(Path(spec.script).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return  # not here (a path in the job's image): nothing to see
    if lines:
        from knack.log import get_logger

        get_logger(__name__).warning(
            "%s calls init_process_group without a timeout (line %s): a node that vanishes before the script creates "
            "its Checkpointer (during init_process_group or DDP's first broadcast) stalls the other nodes for torch's "
            "default timeout, 30 minutes for gloo and 10 for NCCL. Pass timeout=collective_timeout() (from "
            "azext_elastictrain.runtime), as the README's script does (docs/runtime.md, \"A vanished peer\").",
            spec.script, ", ".join(map(str, lines)))


def _plan_and_submit(cmd: Any, target: Target, spec: JobSpec, *, image: str | None, gpus_per_node: int | None,
                     engine: str | None, dry_run: bool) -> Mapping[str, Any] | JobShown:
    """The backend's plan (what --dry-run prints), then, unless a dry run, the submit that takes it."""
    from azext_elastictrain.backends.base import JobRequest

    with az_errors(target, job=spec.name), target.opened(cmd) as backend:
        plan = backend.plan_job(JobRequest(spec, image, gpus_per_node, engine))
        return plan.shown if dry_run else backend.submit_job(plan)


def _job_spec(target: Target, *, script_args: str | None, gpus_per_node: int | None, nproc_per_node: int | None,
              memory_tier: str | None, recovery: str | None, **fields: Any) -> JobSpec:
    """The job's spec from the command's values (``fields``: JobSpec's own; one not given takes the spec's
    default); bad ones are az errors. Without --recovery, the backend's default mode (core/launch.py: in-process
    locally, restart on AKS)."""
    from azext_elastictrain.core.spec import DEFAULT_MEMORY_TIER, JobSpec

    if gpus_per_node is not None and gpus_per_node < 1:
        raise InvalidArgumentValueError(f"--gpus-per-node must be a whole number of at least 1, not {gpus_per_node}",
                                        recommendation="Pass the GPUs each worker pod gets, e.g. 1.")
    try:
        args = tuple(shlex.split(script_args or ""))
    except ValueError as ex:
        raise InvalidArgumentValueError(
            f"--script-args {script_args!r} does not parse: {ex}",
            recommendation='Quote it as one argument: --script-args "--steps 300 --lr 0.05".',
        ) from ex
    # a worker pod runs one training process per GPU unless told otherwise; a local node one
    if nproc_per_node is None:
        nproc_per_node = (gpus_per_node or 1) if target.kind == "aks" else 1
    given = {name: value for name, value in fields.items() if value is not None}
    return JobSpec(**given, nproc_per_node=nproc_per_node, script_args=args,
                   memory_tier=memory_tier or DEFAULT_MEMORY_TIER,
                   recovery=recovery or launch.PROFILES[target.kind].default_recovery)


def list_jobs(cmd: Any, local: bool = False, cluster: str | None = None,
              resource_group_name: str | None = None) -> Sequence[JobShown]:
    target = resolve_target(local=local, resource_group=resource_group_name, cluster=cluster)
    with az_errors(target), target.opened(cmd) as backend:
        return backend.list_jobs()


def show_job(cmd: Any, name: str, local: bool = False, cluster: str | None = None,
             resource_group_name: str | None = None, *, price_as: str | None = None, location: str | None = None,
             currency: str | None = None) -> JobShown:
    target = resolve_target(local=local, resource_group=resource_group_name, cluster=cluster, job=name)
    retail = _retail_prices(cmd, target, price_as, location, currency)
    with az_errors(target, job=name), target.opened(cmd) as backend:
        shown = backend.describe_job(name)
        cost = _job_cost(backend, shown, retail, price_as, location)
    if cost is not None:
        shown["cost"] = cost
    return shown


def _retail_prices(cmd: Any, target: Target, price_as: str | None, location: str | None,
                   currency: str | None) -> RetailPrices:
    """The price client of a command that shows cost; bad --price-as/-l/--currency fail before any request."""
    from azext_elastictrain.clients import prices as price_client
    from azext_elastictrain.core.prices import CurrencyError

    if price_as and not location:
        raise InvalidArgumentValueError("--price-as needs the region whose prices to use",
                                        recommendation=f"Add -l REGION, e.g. --price-as {price_as} -l eastus.")
    if location and not price_as and target.kind == "local":
        raise InvalidArgumentValueError(f"-l {location}: a local job is priced only as the size --price-as names",
                                        recommendation="Add --price-as SIZE, e.g. --price-as Standard_NC4as_T4_v3.")
    try:
        return price_client.for_command(cmd.cli_ctx, currency)
    except CurrencyError as ex:
        raise InvalidArgumentValueError(f"--currency: {ex}", recommendation=ex.recommendation) from ex


def _job_cost(backend: AnyBackend, shown: JobShown, retail: RetailPrices, price_as: str | None,
              location: str | None) -> dict[str, Any] | None:
    """What the job's node-hours cost (core.prices.job_cost) on the pool its workers run on (AKS), or as Spot
    nodes of ``price_as`` in ``location`` (what a local job would cost on Azure); None for a local job without
    --price-as: its nodes are processes here."""
    from azext_elastictrain.core import prices as core_prices

    pool = backend.job_pool()
    if price_as:
        size, region, priority = price_as, location or (pool["location"] if pool else None) or "", "Spot"
        priced_as = "asked (--price-as)"
    elif pool and pool["vmSize"] and pool["location"]:
        size, region, priority = pool["vmSize"], location or pool["location"], pool["priority"] or "Spot"
        priced_as = f"pool {pool['name']}"
    else:
        return None
    hours, useful = core_prices.node_hours(shown, priority)
    cost = core_prices.job_cost(hours, useful, retail.price(size, region))
    cost["pricedAs"] = priced_as
    return cost


PICTURE_FORMATS = (".png", ".svg", ".pdf")


def job_timeline(cmd: Any, *, name: str, local: bool = False, cluster: str | None = None,
                 output_file: str | None = None, resource_group_name: str | None = None, price_as: str | None = None,
                 location: str | None = None, currency: str | None = None) -> dict[str, Any]:
    """The series of the job's current run (core.eventlog.timeline); with --output-file, also its picture."""
    import os

    from azext_elastictrain.core.eventlog.timeline import series

    target = resolve_target(local=local, resource_group=resource_group_name, cluster=cluster, job=name)
    if output_file is not None:
        folder = os.path.dirname(os.path.abspath(output_file))
        if not os.path.isdir(folder):
            raise InvalidArgumentValueError(f"--output-file {output_file!r}: folder {folder!r} does not exist",
                                            recommendation="Create the folder first, or write the picture elsewhere.")
        if os.path.splitext(output_file)[1].lower() not in PICTURE_FORMATS:
            raise InvalidArgumentValueError(f"--output-file {output_file!r} is not a picture file name",
                                            recommendation="End it with " + ", ".join(PICTURE_FORMATS) + ".")
        _require_matplotlib()
    retail = _retail_prices(cmd, target, price_as, location, currency)
    with az_errors(target, job=name), target.opened(cmd) as backend:
        shown = series(backend.job_events(name))
        priced = price_as or target.kind != "local"  # a local job's nodes have no price of their own
        cost = _job_cost(backend, backend.describe_job(name), retail, price_as, location) if priced else None
    if cost is not None:
        shown["cost"] = cost
    if output_file is not None:
        from azext_elastictrain.timeline_picture import draw

        if not shown["worlds"]:
            raise InvalidArgumentValueError(f"job {name!r} has not trained yet: there is nothing to draw",
                                            recommendation="Draw it once 'az elastictrain job show' reports a step.")
        draw(shown, f"job {name}: step and world size over time", output_file)
        shown["outputFile"] = os.path.abspath(output_file)
    return shown


def _require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        from azure.cli.core.azclierror import ValidationError

        raise ValidationError("--output-file needs matplotlib, which az's Python does not have",
                              recommendation="Install it into az's Python ('az extension add' does not): "
                                             "pip install matplotlib, or install this extension with its [plot] "
                                             "extra; or leave out --output-file and plot the -o json series.")


def job_logs(cmd: Any, *, name: str, local: bool = False, cluster: str | None = None, node: str | None = None,
             follow: bool = False, tail: int | None = None, timeout: int | None = None,
             resource_group_name: str | None = None, rank: int | None = None, pod: str | None = None) -> None:
    """Print the nodes' logs (each line prefixed with its node, or pod, when there are several)."""
    from azext_elastictrain.backends.base import LogRequest

    target = resolve_target(local=local, resource_group=resource_group_name, cluster=cluster, job=name)
    if tail is not None and tail < 0:
        raise InvalidArgumentValueError(f"--tail {tail} is negative", recommendation="Pass a line count >= 0.")
    if timeout is not None and timeout <= 0:
        raise InvalidArgumentValueError(f"--timeout {timeout} must be positive",
                                        recommendation="Pass seconds, e.g. --timeout 600.")
    request = LogRequest(node=node, rank=rank, pod=pod, follow=follow, tail=tail, timeout=timeout)
    with az_errors(target, job=name), target.opened(cmd) as backend:
        logs = backend.job_logs(name, request)
        _print(logs.lines, prefix=logs.prefixed, follow=follow)


def _print(lines: Iterable[tuple[str, str]], *, prefix: bool, follow: bool) -> None:
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


def wait_job(cmd: Any, *, name: str, local: bool = False, cluster: str | None = None, state: str | None = None,
             step: int | None = None, world_size: int | None = None, timeout: int = 600,
             resource_group_name: str | None = None) -> JobShown:
    """Poll the job until it is in ``state`` (default Succeeded), reached ``step`` and/or trains at
    ``world_size``; fail when it ends without getting there or time runs out."""
    from azext_elastictrain.backends.base import WaitFor

    target = resolve_target(local=local, resource_group=resource_group_name, cluster=cluster, job=name)
    if step is not None and step < 0:
        raise InvalidArgumentValueError(f"--step {step} is negative", recommendation="Pass a step >= 0.")
    if world_size is not None and world_size < 1:
        raise InvalidArgumentValueError(f"--world-size {world_size} must be at least 1",
                                        recommendation="Pass the number of ranks to wait for, e.g. 2.")
    if timeout <= 0:
        raise InvalidArgumentValueError(f"--timeout {timeout} must be positive",
                                        recommendation="Pass seconds, e.g. --timeout 600.")
    with az_errors(target, job=name), target.opened(cmd) as backend:
        return backend.wait_job(name, WaitFor(state=state, step=step, world_size=world_size, timeout=timeout))


def delete_job(cmd: Any, *, name: str, local: bool = False, cluster: str | None = None, yes: bool = False,
               dry_run: bool = False, delete_checkpoints: bool = False,
               resource_group_name: str | None = None) -> Mapping[str, Any] | JobDeleted:
    """Stop the job's nodes (local: every agent and descendant, checked by pid; AKS: the ElasticJob and its
    pods). Checkpoints stay unless --delete-checkpoints (local only): losing them by accident is the worst
    outcome."""
    from azure.cli.core.util import user_confirmation

    target = resolve_target(local=local, resource_group=resource_group_name, cluster=cluster, job=name)
    with az_errors(target, job=name), target.opened(cmd) as backend:
        plan = backend.plan_job_delete(name, delete_checkpoints=delete_checkpoints)
        if dry_run:
            return plan.shown
        user_confirmation(plan.prompt, yes=yes)
        return backend.delete_job(plan)
