"""The backend contract: both backends implement backends.base.Backend, one session per AKS command, one view
of a job, one table of az errors, one place that decides where a command runs."""
from __future__ import annotations

import inspect

import pytest
from azure.cli.core import azclierror as az

from azext_elastictrain import _errors
from azext_elastictrain._validators import Target, resolve_checkpoints, resolve_cluster, resolve_target
from azext_elastictrain.backends.aks.backend import AksBackend
from azext_elastictrain.backends.base import Backend, WaitFor
from azext_elastictrain.backends.local.backend import LocalBackend
from azext_elastictrain.clients.kube import KubeError
from azext_elastictrain.core.errors import ArmError, ClusterNotFound, JobNotFound, NotReached, OptionNotHere
from azext_elastictrain.core.eventlog.view import build_job_view, wait_for_job
from tests.support.fake_kube import FakeKube

IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
GPU = {"name": "gpu", "mode": "User", "vmSize": "Standard_NC4as_T4_v3", "scaleSetPriority": "Spot",
       "nodeTaints": ["sku=gpu:NoSchedule"]}


def _protocol_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(Backend).items()
            if inspect.isfunction(member) and not name.startswith("_")}


@pytest.mark.parametrize("backend", [LocalBackend, AksBackend])
def test_each_backend_implements_every_method_of_the_protocol_with_its_parameters(backend) -> None:
    for name, wanted in _protocol_methods().items():
        method = getattr(backend, name, None)
        assert callable(method), f"{backend.__name__} lacks {name}"
        assert list(inspect.signature(method).parameters) == list(wanted.parameters), name


class CountingArm:
    """ARM as the AKS backend sees it, counting what it is asked."""

    subscription, tenant, storage_suffix = "sub", "tenant", "core.windows.net"

    def __init__(self) -> None:
        self.asked: list[str] = []

    def get(self, kind, ref):
        self.asked.append(f"GET {kind}")
        if kind == "cluster":
            return {"name": ref["name"], "tags": {"elastictrain": "1", "elastictrain-storage": "acct1"},
                    "properties": {"agentPoolProfiles": [GPU]}}
        return {"properties": {"primaryEndpoints": {"blob": "https://acct1.blob.core.windows.net/"}}}

    def user_kubeconfig(self, resource_group, cluster):
        self.asked.append("listClusterUserCredential")
        return b"in memory"


def test_an_aks_command_asks_arm_and_fetches_credentials_once_however_often_it_looks() -> None:
    arm, kube = CountingArm(), FakeKube().with_operator_crd()
    backend = AksBackend(arm, "rg", "trainer", kube_connect=lambda _: kube)
    plan = backend.plan_job(_request())
    backend.submit_job(plan)
    for _ in range(5):
        backend.describe_job("cifar")
    backend.list_jobs()
    assert sorted(arm.asked) == ["GET cluster", "GET storage_account", "listClusterUserCredential"]
    assert sum(c[:2] == ("get", "ElasticJob") for c in kube.calls) >= 6


def test_a_dry_run_plans_without_kubernetes_or_credentials() -> None:
    arm, kube = CountingArm(), FakeKube().with_operator_crd()
    shown = AksBackend(arm, "rg", "trainer", kube_connect=lambda _: kube).plan_job(_request()).shown
    assert shown["dryRun"] and shown["object"]["kind"] == "ElasticJob"
    assert "listClusterUserCredential" not in arm.asked and kube.calls == []


def _request():
    from azext_elastictrain.backends.base import JobRequest
    from azext_elastictrain.core.spec import JobSpec

    return JobRequest(JobSpec(name="cifar", script="/app/train.py", min_nodes=1, max_nodes=2), IMAGE, 1)


def test_options_of_the_other_backend_are_usage_errors_that_say_which() -> None:
    from azext_elastictrain.backends.base import LogRequest

    aks = AksBackend(CountingArm(), "rg", "trainer", kube_connect=lambda _: FakeKube())
    with pytest.raises(OptionNotHere, match="--node names a node of a local job"):
        aks.job_logs("cifar", LogRequest(node="node-0"))
    with pytest.raises(OptionNotHere, match="--delete-checkpoints is for local jobs"):
        aks.plan_job_delete("cifar", delete_checkpoints=True)


# -- the job view ---------------------------------------------------------------------------------------------

def _events() -> list[dict]:
    return [{"time": 5, "event": "started", "world_size": 2},
            {"time": 10, "event": "progress", "step": 40, "world_size": 2, "samples_per_s": 100.0},
            {"time": 11, "event": "preempted", "node": "a", "step": 41, "source": "scheduled_events"},
            {"time": 12, "event": "preempted", "node": "b", "step": 41, "source": "sigterm"},
            {"time": 20, "event": "restored", "step": 41, "world_size": 1},
            {"time": 30, "event": "checkpoint", "step": 50}]


def test_an_eviction_is_a_notice_or_a_node_lost_without_one_each_node_once() -> None:
    view = build_job_view(_events(), created=1.0, nodes=[], state_of=lambda s: "Running",
                          lost_nodes=lambda state: ["a", "c", "c"])
    assert view.evictions == 2  # a's notice, c lost without one; b's SIGTERM alone is torchrun restarting
    assert (view.step, view.world_size, view.last_checkpoint_step) == (41, 1, 50)
    shown = view.describe({"name": "cifar"}, {"keep": 3})
    assert shown["lastCheckpointTime"] == "1970-01-01T00:00:30Z"
    # goodput counts from the restore at 20: its world has recorded no step boundary after it yet
    assert (shown["goodput"], shown["stepsLost"], shown["timeLost"]["starting"]) == (0.0, 0, 15.0)
    assert "workerRestarts" not in shown and "eventsError" not in shown


def test_events_of_an_earlier_run_of_the_same_name_are_not_counted() -> None:
    view = build_job_view(_events(), created=25.0, nodes=[], state_of=lambda s: "Running",
                          lost_nodes=lambda state: [])
    assert (view.evictions, view.step, view.last_checkpoint_step) == (0, None, 50)


def test_wait_fails_once_a_job_ended_or_time_ran_out_and_returns_once_reached() -> None:
    now = [0.0]
    shown = [{"state": "Running", "step": 10}, {"state": "Running", "step": 20}, {"state": "Failed", "step": 20}]

    def sleep(seconds):
        now[0] += seconds

    def wait(describe, **until):
        return wait_for_job(describe, "cifar", timeout=30, interval=10, logs_hint="logs", clock=lambda: now[0],
                            sleep=sleep, **{"state": None, "step": None, "world_size": None, **until})

    assert wait(iter(shown).__next__, step=20)["step"] == 20
    with pytest.raises(NotReached, match="is Failed at step 20: it will not reach step 30"):
        wait(iter(shown).__next__, step=30)
    with pytest.raises(NotReached, match="timed out after 30s"):
        wait(lambda: {"state": "Running", "step": 1}, step=30)
    assert WaitFor().timeout == 600


# -- how a job was launched ----------------------------------------------------------------------------------

def _launched_both(recovery: str) -> tuple[dict, list[dict]]:
    """The launched part of `job show` of one spec on each backend: local from the job's record (an in-process job
    with its coordinator), AKS from the spec read back from each engine's manifest."""
    from azext_elastictrain.backends.aks import describe
    from azext_elastictrain.backends.local import following, record
    from azext_elastictrain.core.aks import manifests as m
    from azext_elastictrain.core.spec import JobSpec

    cluster = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                              checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
    spec = JobSpec(name="cifar", script="/app/train.py", min_nodes=1, max_nodes=3, nodes=2, nproc_per_node=2,
                   script_args=("--steps", "900"), checkpoint_interval=50, checkpoint_interval_seconds=600.0, keep=4,
                   memory_tier="4Gi", warm_start=False, recovery=recovery,
                   env=("NCCL_DEBUG=INFO", "ELASTICTRAIN_REPLICA_CHECK_STEPS=5"))
    url = "https://ckptstore01.blob.core.windows.net/checkpoints/cifar"
    recorded = record.new_record(spec, cluster="local", script=spec.script, rdzv_id="cifar-1a2b3c4d")
    if spec.in_process:
        recorded["coordinator"] = {"address": "http://127.0.0.1:40002", "pid": 1, "started": 0.0, "log": "c.log"}
    manifests = [m.render_elastic_job(spec, cluster, IMAGE, run_id="cifar-1a2b3c4d"),
                 m.render_k8s_job(spec, cluster, IMAGE, run_id="cifar-1a2b3c4d")[-1]]
    return following.launched_of(recorded, url), [describe.launched_of(j, checkpoint_url=url) for j in manifests]


@pytest.mark.parametrize("recovery", ["restart", "in-process"])
def test_both_backends_show_how_a_job_was_launched_with_the_same_keys_and_values(recovery) -> None:
    """core/launched.py makes the launched part of `job show` on both backends: every option of the spec, where it
    checkpoints, its rendezvous; only what one backend alone has (OWN_LAUNCHED) differs."""
    from azext_elastictrain.backends.aks.describe import OWN_LAUNCHED as AKS_OWN
    from azext_elastictrain.backends.local.following import OWN_LAUNCHED as LOCAL_OWN

    local, on_aks = _launched_both(recovery)
    assert set(LOCAL_OWN) <= set(local) if recovery == "in-process" else not set(LOCAL_OWN) & set(local)
    for aks in on_aks:
        assert set(local) - set(LOCAL_OWN) == set(aks) - set(AKS_OWN) and aks["image"] == IMAGE
    # read back from the ElasticJob, every option is what the local record says (the pod holds --env in its order)
    elastic = on_aks[0]
    shared = set(local) - set(LOCAL_OWN) - {"created", "env"}
    assert {k: local[k] for k in shared} == {k: elastic[k] for k in shared}
    assert sorted(local["env"]) == sorted(elastic["env"]) and len(local["env"]) == 2
    assert elastic["rdzvId"] == (None if recovery == "in-process" else "cifar-1a2b3c4d")


def test_the_launched_type_has_a_key_for_every_field_of_the_spec_in_its_order() -> None:
    """core/launched.py's ``Launched`` names each key for the type checker: an option added to ``JobSpec`` is shown
    (and checked) only once it has a key there, in the spec's order, as ``launched`` writes them."""
    from dataclasses import fields

    from azext_elastictrain.core.launched import Launched, LaunchedOwn, key, launched
    from azext_elastictrain.core.spec import JobSpec

    spec_keys = [key(f.name) for f in fields(JobSpec) if f.name != "name"]
    typed = set(Launched.__annotations__) - set(LaunchedOwn.__annotations__)
    assert typed == {"created", *spec_keys, "checkpointUrl", "rdzvId"}
    shown = launched(JobSpec(name="cifar", script="/app/train.py", min_nodes=1, max_nodes=2), created=None,
                     checkpoint_url=None, rdzv_id="r")
    assert list(shown) == ["created", *spec_keys, "checkpointUrl", "rdzvId"]


def test_a_job_whose_manifest_is_not_ours_still_shows_every_key_with_what_could_be_read() -> None:
    """A manifest made by another tool or an older version: a setting this version cannot read (the runtime's
    reader refuses it) and a missing script do not fail `job show`; what was not read is None."""
    from azext_elastictrain.backends.aks import describe
    from azext_elastictrain.core.launched import launched

    local, _ = _launched_both("restart")
    foreign = {"apiVersion": "elastic.pytorch.org/v1alpha1", "kind": "ElasticJob",
               "metadata": {"name": "theirs", "namespace": "elastictrain"},
               "spec": {"minReplicas": 1, "maxReplicas": 2, "replicaSpecs": {"Worker": {"replicas": 2, "template": {
                   "spec": {"containers": [{"name": "worker", "image": IMAGE, "args": ["--nproc-per-node=1"],
                                            "env": [{"name": "ELASTICTRAIN_KEEP", "value": "many"},
                                                    {"name": "HOME", "value": "/root"}]}]}}}}}}
    assert isinstance(describe.spec_of(foreign), dict)
    shown = describe.launched_of(foreign)
    assert set(shown) - {"image"} == set(local) - {"image"} == set(launched(
        describe.spec_of(foreign), created=None, checkpoint_url=None, rdzv_id=None))
    assert (shown["script"], shown["keep"], shown["nodeCount"], shown["env"]) == (None, None, 2, ["HOME=/root"])


# -- where a command runs, and its errors ---------------------------------------------------------------------

def test_the_place_of_a_command_is_resolved_once_with_usage_errors_before_any_request() -> None:
    assert resolve_target(local=True, job="cifar") == Target("local", "local")
    assert resolve_target(resource_group="rg", cluster="c1") == Target("aks", "c1", "rg")
    assert resolve_cluster(needs_name=False) == Target("aks", None, None)
    assert resolve_checkpoints(url="https://a.blob.core.windows.net/c/j", connection_string=None, local=False,
                               cluster=None, job=None, resource_group=None).kind == "url"
    with pytest.raises(az.MutuallyExclusiveArgumentError):
        resolve_target(local=True, resource_group="rg", cluster="c1")
    with pytest.raises(az.RequiredArgumentMissingError):
        resolve_target(resource_group="rg")
    with pytest.raises(az.ArgumentUsageError, match="say where the job runs"):
        resolve_target()
    with pytest.raises(az.InvalidArgumentValueError):
        resolve_target(local=True, job="Not_A_Name")


def test_every_row_of_the_error_table_names_a_type_that_exists() -> None:
    for path, _ in _errors.TABLE:
        assert isinstance(_errors._loaded(path), type), path


@pytest.mark.parametrize("error, target, expected, words", [
    (ClusterNotFound("no local cluster named 'x'"), Target("local", "x"), az.ResourceNotFoundError,
     "cluster create --local --name x"),
    (ClusterNotFound("no AKS cluster"), Target("aks", "c1", "rg"), az.ResourceNotFoundError, "cluster list -g rg"),
    (JobNotFound("no job 'j'"), Target("aks", "c1", "rg"), az.ResourceNotFoundError, "job list -g rg -c c1"),
    (OptionNotHere("--rank is for AKS", "use --node"), Target("local", "x"), az.ArgumentUsageError, "use --node"),
    (NotReached("timed out", "wait longer"), Target("local", "x"), az.UnclassifiedUserFault, "wait longer"),
    (ArmError(403, "AuthorizationFailed", "no"), Target("aks", "c1", "rg"), az.ForbiddenError, ""),
    (ArmError(409, "Conflict", "busy"), Target("aks", "c1", "rg"), az.AzureResponseError, ""),
    (KubeError("no answer"), Target("aks", "c1", "rg"), az.AzureConnectionError, "cluster show -g rg -n c1"),
])
def test_errors_leave_as_the_az_error_of_their_row(error, target, expected, words) -> None:
    with pytest.raises(expected) as raised:
        with _errors.az_errors(target):
            raise error
    assert raised.value.__cause__ is error and words in (raised.value.recommendations or [""])[0] + str(raised.value)


def test_an_error_of_no_row_passes_unchanged() -> None:
    with pytest.raises(KeyError):
        with _errors.az_errors(Target("local", "x")):
            raise KeyError("a bug stays a bug")


def test_the_checkpoint_commands_read_the_login_for_the_grant_hint_only_on_a_403() -> None:
    """The role hint names the login's object id (a token read): built when blob answers 403, not for every
    checkpoint command that succeeds."""
    from types import SimpleNamespace

    from azext_elastictrain._errors import _access_denied
    from azext_elastictrain.core.blobstore import AccessDenied

    class SignedIn(CountingArm):
        def signed_in_principal(self):
            self.asked.append("token")
            return "11111111-2222-3333-4444-555555555555", "User"

    arm = SignedIn()
    location = AksBackend(arm, "rg", "trainer", kube_connect=lambda _: FakeKube()).checkpoint_location("cifar")
    assert location.url.endswith("/cifar") and "token" not in arm.asked, "no token read before blob refuses"
    error = _access_denied(SimpleNamespace(grant=location.grant), AccessDenied("HTTP 403 AuthorizationFailure"))
    assert arm.asked.count("token") == 1
    hint = " ".join(error.recommendations)
    assert "11111111-2222-3333-4444-555555555555" in hint and "Storage Blob Data Contributor" in hint
