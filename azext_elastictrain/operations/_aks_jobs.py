"""What the job and checkpoint commands on AKS share: where a command runs (--local or -g/-c), the jobs
backend on the logged-in subscription, and its errors as az errors."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from azure.cli.core.azclierror import (
    ArgumentUsageError,
    AzureConnectionError,
    AzureResponseError,
    ForbiddenError,
    InvalidArgumentValueError,
    MutuallyExclusiveArgumentError,
    RequiredArgumentMissingError,
    ResourceNotFoundError,
    UnauthorizedError,
    ValidationError,
)
from knack.log import get_logger

logger = get_logger(__name__)


def on_aks(local: bool, resource_group: str | None, cluster: str | None, what: str = "job") -> bool:
    """True for a cluster on Azure (-g and -c), False for --local; anything else is a usage error."""
    if local and resource_group:
        raise MutuallyExclusiveArgumentError(
            "--local and -g/--resource-group name different clusters: pass one",
            recommendation=f"--local [--cluster NAME] for a {what} on this machine; -g RG -c CLUSTER for one on AKS.")
    if resource_group:
        if not cluster:
            raise RequiredArgumentMissingError(
                "-g/--resource-group needs -c/--cluster: the AKS cluster in that group",
                recommendation="List the clusters with 'az elastictrain cluster list -g RG'.")
        return True
    if local:
        return False
    raise ArgumentUsageError(
        f"say where the {what} runs: --local, or -g RG -c CLUSTER for an AKS cluster",
        recommendation="Add --local (real etcd, Azurite and torchrun processes here), or -g and -c of a cluster "
                       "made with 'az elastictrain cluster create -g RG -n CLUSTER'.")


def login_credential(cmd):
    """The CLI's login as a token credential (Entra ID): what blob storage is read with."""
    from azure.cli.core._profile import Profile

    return Profile(cli_ctx=cmd.cli_ctx).get_login_credentials()[0]


def aks_jobs(cmd, *, storage: bool = True):
    from azext_elastictrain.clients.arm import AzureArm
    from azext_elastictrain.backends.aks.jobs import AksJobs

    return AksJobs(AzureArm(cmd.cli_ctx), credential=login_credential(cmd) if storage else None,
                   progress=logger.warning)


@contextmanager
def aks_job_errors(resource_group: str, cluster: str) -> Iterator[None]:
    from azext_elastictrain.backends.aks.describe import JobNotFound
    from azext_elastictrain.backends.aks.cluster import ArmError, ClusterNotFound
    from azext_elastictrain.backends.aks.jobs import GpuPoolMissing, JobExists
    from azext_elastictrain.clients.kube import KubeError
    from azext_elastictrain.core.spec import SpecError
    from azext_elastictrain.operations._aks import _by_status

    where = f"-g {resource_group} -c {cluster}"
    try:
        yield
    except JobNotFound as ex:
        raise ResourceNotFoundError(
            str(ex), recommendation=f"List the jobs with 'az elastictrain job list {where}'.") from ex
    except GpuPoolMissing as ex:
        raise ValidationError(
            str(ex), recommendation=f"Run 'az elastictrain cluster create -g {resource_group} -n {cluster}' "
                                    "again: it adds what is missing, the GPU Spot pool included.") from ex
    except JobExists as ex:
        raise ValidationError(
            str(ex), recommendation=f"'az elastictrain job delete {where} -n NAME', or pick another name.") from ex
    except SpecError as ex:
        raise InvalidArgumentValueError(str(ex)) from ex
    except ClusterNotFound as ex:
        raise ResourceNotFoundError(
            str(ex), recommendation=f"List them with 'az elastictrain cluster list -g {resource_group}'.") from ex
    except ArmError as ex:
        raise _by_status(ex.status)(str(ex)) from ex
    except KubeError as ex:
        if ex.status is None:
            raise AzureConnectionError(
                str(ex), recommendation=f"'az elastictrain cluster show -g {resource_group} -n {cluster}' tells "
                                        "whether the cluster is up.") from ex
        error = {401: UnauthorizedError, 403: ForbiddenError, 404: ResourceNotFoundError}.get(
            ex.status, AzureResponseError)
        raise error(str(ex)) from ex
