"""Where a command runs, decided once: ``--local [--cluster]``, ``-g RG -c CLUSTER`` (AKS) or ``--url`` (storage).

Every command calls ``resolve_target`` first; what it returns names the place (for messages) and builds the
place's ``Backend`` with its clients (``Target.backend``). Bad combinations are az usage errors that say how to
name a place, raised before any login or request.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from azure.cli.core.azclierror import (
    ArgumentUsageError,
    InvalidArgumentValueError,
    MutuallyExclusiveArgumentError,
    RequiredArgumentMissingError,
)

if TYPE_CHECKING:
    from azext_elastictrain.backends.base import AnyBackend, ScheduleRequest
    from azext_elastictrain.core.ports import Arm

LOCAL, AKS, URL = "local", "aks", "url"
_LOCAL_HELP = "Add --local (real etcd, Azurite and torchrun processes here)"


@dataclass(frozen=True)
class Target:
    """The place a command runs: ``kind`` (local, aks, url), the cluster and resource group (AKS) or URL."""

    kind: str
    cluster: str | None = None
    resource_group: str | None = None
    url: str | None = None

    @property
    def where(self) -> str:
        """The arguments that name this place, for recommendations: '--local --cluster X' or '-g RG -c X'."""
        if self.kind == LOCAL:
            return f"--local --cluster {self.cluster}"
        return f"-g {self.resource_group} -c {self.cluster}"

    def backend(self, cmd: Any, *, signed_out: "bool | str" = False) -> AnyBackend:
        """The place's ``backends.base.Backend``, its clients resolved for this command; ``signed_out``: an AKS
        backend on no account at all, for a dry run without a login (a text: why the login's token failed)."""
        from azext_elastictrain.backends import aks_backend, local_backend

        if self.kind == LOCAL:
            return local_backend(Path(cmd.cli_ctx.config.config_dir) / "elastictrain" / "local", self.cluster or "")
        from knack.log import get_logger

        from azext_elastictrain.clients.arm import AzureArm, SignedOutArm

        arm = SignedOutArm(cmd.cli_ctx, signed_out if isinstance(signed_out, str) else None) if signed_out \
            else AzureArm(cmd.cli_ctx)
        return aks_backend(arm, self.resource_group, self.cluster, credential=LoginCredential(cmd.cli_ctx),
                           progress=get_logger(__name__).warning,
                           spot_market=None if signed_out else _spot_market(cmd.cli_ctx, arm))

    @contextmanager
    def opened(self, cmd: Any, *, signed_out: "bool | str" = False) -> Iterator[AnyBackend]:
        """``backend()`` for the length of a ``with``: what it opened is closed after."""
        backend = self.backend(cmd, signed_out=signed_out)
        try:
            yield backend
        finally:
            backend.close()


def _spot_market(cli_ctx: Any, arm: Arm) -> Callable[[str, str], dict[str, Any]]:
    """The GPU size's prices and eviction band for the cluster preflight (a lookup, done only when called)."""
    def offer(size: str, location: str) -> dict[str, Any]:
        from azext_elastictrain.clients.spot import for_arm

        return for_arm(cli_ctx, arm).offer(size, location)
    return offer


class LoginCredential:  # pylint: disable=too-few-public-methods  # azure-core's TokenCredential protocol
    """The CLI's login as a token credential (Entra ID), asked for only when storage is first read: a dry run,
    logs or a delete never need it."""

    def __init__(self, cli_ctx: Any) -> None:
        self._cli_ctx, self._credential = cli_ctx, None

    def _login(self) -> Any:
        if self._credential is None:
            from azure.cli.core._profile import Profile

            from azext_elastictrain._client_factory import command_subscription

            # the tenant of the command's subscription (--subscription), as for the ARM clients
            subscription = command_subscription(self._cli_ctx)
            self._credential = Profile(cli_ctx=self._cli_ctx).get_login_credentials(subscription_id=subscription)[0]
        return self._credential

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        return self._login().get_token(*scopes, **kwargs)

    def renew(self) -> None:
        """Forget the login's credential object, and the tokens it cached in memory: the next get_token asks
        Entra ID (or the managed-identity endpoint) again. For a token a service refused before it expired."""
        self._credential = None


def resolve_target(*, local: bool = False, resource_group: str | None = None, cluster: str | None = None,
                   job: str | None = None, what: str = "job") -> Target:
    """A job, eviction or checkpoint command's place: ``--local [--cluster NAME]`` or ``-g RG -c CLUSTER``."""
    if local and resource_group:
        raise MutuallyExclusiveArgumentError(
            "--local and -g/--resource-group name different clusters: pass one",
            recommendation=f"--local [--cluster NAME] for a {what} on this machine; -g RG -c CLUSTER for one on AKS.")
    if resource_group:
        if not cluster:
            raise RequiredArgumentMissingError(
                "-g/--resource-group needs -c/--cluster: the AKS cluster in that group",
                recommendation="List the clusters with 'az elastictrain cluster list -g RG'.")
        return Target(AKS, cluster, resource_group)
    if local:
        return Target(LOCAL, _check_names(cluster, job))
    raise ArgumentUsageError(
        f"say where the {what} runs: --local, or -g RG -c CLUSTER for an AKS cluster",
        recommendation=f"{_LOCAL_HELP}, or -g and -c of a cluster made with 'az elastictrain cluster create -g RG "
                       "-n CLUSTER'.")


def resolve_cluster(*, local: bool = False, resource_group: str | None = None, name: str | None = None,
                    needs_name: bool = True) -> Target:
    """A cluster command's place: ``--local [--name]`` or ``-g RG [-n NAME]`` (cluster list: ``-g`` optional)."""
    if local and resource_group:
        raise MutuallyExclusiveArgumentError(
            "--local and --resource-group name two different places",
            recommendation="Use --local for a cluster on this machine, or -g/--resource-group for one on Azure.")
    if local:
        return Target(LOCAL, _check_names(name, None))
    if not resource_group and needs_name:
        raise ArgumentUsageError(
            "say where the cluster is: --local (this machine) or -g/--resource-group (Azure)",
            recommendation=f"{_LOCAL_HELP}, or -g RESOURCE_GROUP -n NAME for an AKS cluster.")
    if needs_name and not name:
        raise RequiredArgumentMissingError("a cluster on Azure needs its name: -n/--name",
                                           recommendation="List them with 'az elastictrain cluster list'.")
    return Target(AKS, name, resource_group)


def resolve_eviction(*, local: bool = False, resource_group: str | None = None, cluster: str | None = None,
                     job: str | None = None) -> Target:
    """`evict simulate`'s place: ``-c`` alone means an AKS cluster there (it needs ``-g``)."""
    if local and resource_group:
        raise ArgumentUsageError("--local and -g/--resource-group name two different clusters: give one",
                                 recommendation="-g RG -c CLUSTER for AKS; --local [-c NAME] for the local cluster.")
    if resource_group or (cluster and not local):
        if not resource_group or not cluster:
            raise RequiredArgumentMissingError(
                "an AKS cluster is named by both -g/--resource-group and -c/--cluster",
                recommendation="e.g. az elastictrain evict simulate -g ml-rg -c spot-train --job cifar --rank 1")
        return Target(AKS, cluster, resource_group)
    if not local:
        raise ArgumentUsageError(
            "say which cluster's nodes to evict",
            recommendation="Use -g RG -c CLUSTER for an AKS cluster, or --local --job JOB for the local cluster.")
    return Target(LOCAL, _check_names(cluster, job))


def resolve_checkpoints(*, url: str | None, connection_string: str | None, local: bool, cluster: str | None,
                        job: str | None, resource_group: str | None) -> Target:
    """Whose checkpoints: exactly one of ``--url``, ``--local [--cluster] --job`` or ``-g -c --job``."""
    if resource_group:
        if url or local or connection_string:
            raise MutuallyExclusiveArgumentError(
                "-g/-c --job names checkpoints in an AKS cluster's storage: drop --url, --local and "
                "--connection-string",
                recommendation="Pass exactly one of --url, --local --job, or -g RG -c CLUSTER --job JOB.")
        if not cluster or not job:
            raise RequiredArgumentMissingError(
                "-g/--resource-group needs -c/--cluster and --job: the AKS cluster and the job whose checkpoints "
                "to use",
                recommendation=f"List the cluster's jobs with 'az elastictrain job list -g {resource_group} -c "
                               "CLUSTER'.")
        _check_names(None, job)
        return Target(AKS, cluster, resource_group)
    if url and (local or job or cluster):
        raise MutuallyExclusiveArgumentError(
            "pass either --url or --local --job, not both",
            recommendation="--url names checkpoints anywhere; --local [--cluster NAME] --job JOB those of a job on a "
                           "local cluster.")
    if url:
        return Target(URL, url=url)
    if not (local or job or cluster):
        raise RequiredArgumentMissingError(
            "say whose checkpoints: --url, --local --job, or -g -c --job",
            recommendation="Pass --url https://<account>.blob.core.windows.net/<container>/<job>, --local --job JOB "
                           "for a job on the local cluster, or -g RG -c CLUSTER --job JOB for a job on AKS.")
    if not local:
        raise RequiredArgumentMissingError(
            "--job and --cluster name a job of a cluster: add --local, or -g RG for an AKS cluster",
            recommendation="For checkpoints anywhere else in Azure storage pass --url instead.")
    if not job:
        raise RequiredArgumentMissingError("--local needs --job: the job whose checkpoints to use",
                                           recommendation="List the cluster's jobs with 'az elastictrain job list "
                                                          "--local'.")
    if connection_string:
        raise MutuallyExclusiveArgumentError(
            "--connection-string goes with --url; --local uses the local cluster's own storage",
            recommendation="Drop --connection-string.")
    return Target(LOCAL, _check_names(cluster, job))


def _check_names(cluster: str | None, job: str | None) -> str:
    """The local cluster's name (default 'local'), after checking it and the job's: they become paths."""
    from azext_elastictrain.core.layout import validate_job_name
    from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT, LocalClusterSpec, SpecError

    cluster = cluster or LOCAL_CLUSTER_DEFAULT
    try:
        LocalClusterSpec(cluster)
        if job is not None:
            validate_job_name(job)
    except (SpecError, ValueError) as ex:
        raise InvalidArgumentValueError(str(ex)) from ex
    return cluster


def resolve_schedule(*, schedule: bool, job: str | None, rate: float | None, duration: float | None,
                     notice_share: float | None, notice_seconds: float | None, replace_after: float | None,
                     seed: int | None, node: str | None = None, count: int | None = None, rank: int | None = None,
                     pool: str | None = None, wait: bool = False) -> ScheduleRequest | None:
    """`evict simulate --schedule`'s request (a ``backends.base.ScheduleRequest``), or None without --schedule.

    Its values are checked here, before any cluster is looked at (``core.chaos.ScheduleSpec.validate``, whose
    ScheduleError leaves through ``_errors``); the backend's plan fills its own defaults and checks again."""
    from azext_elastictrain.backends.base import ScheduleRequest
    from azext_elastictrain.core.chaos import ScheduleSpec

    only = {"--rate": rate, "--duration": duration, "--notice-share": notice_share, "--seed": seed}
    if not schedule:
        given = [flag for flag, value in only.items() if value is not None]
        if given:
            raise ArgumentUsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for an eviction "
                                     "schedule: add --schedule",
                                     recommendation="e.g. az elastictrain evict simulate --local --job cifar "
                                                    "--schedule --rate 1 --duration 600 --dry-run")
        return None
    chosen = [flag for flag, value in (("--node", node), ("--count", count), ("--rank", rank), ("--pool", pool),
                                       ("--wait", wait or None)) if value is not None]
    if chosen:
        raise MutuallyExclusiveArgumentError(
            f"--schedule chooses each node itself and always follows the recovery: drop {', '.join(chosen)}",
            recommendation="Give --job JOB with --rate and --duration.")
    if job is None or rate is None or duration is None:
        missing = [flag for flag, value in (("--job", job), ("--rate", rate), ("--duration", duration))
                   if value is None]
        raise RequiredArgumentMissingError(
            f"--schedule needs {', '.join(missing)}: whose nodes go, how many a minute, for how many seconds",
            recommendation="e.g. az elastictrain evict simulate --local --job cifar --schedule --rate 1 "
                           "--duration 600 --yes")
    ScheduleSpec.asked(rate, duration, notice_share=notice_share, notice_seconds=notice_seconds,
                       replace_after=replace_after, seed=seed)  # raises ScheduleError for a bad value
    return ScheduleRequest(job=job, rate=rate, duration=duration, notice_share=notice_share,
                           notice_seconds=notice_seconds, replace_after=replace_after, seed=seed)
