"""install() and health() through the KubeClient interface, on FakeKube (tests/support/fake_kube.py)."""
from __future__ import annotations

import pytest

from azext_elastictrain.backends.aks import incluster
from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.clients.kube import KubeError
from azext_elastictrain.core.ports import KubeClient
from tests.support.fake_kube import FakeKube

SPEC = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                       checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
NS = SPEC.namespace


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


def _healthy(kube: FakeKube) -> None:
    """What a working cluster reports once everything is up (2 GPU nodes)."""
    kube.set_status("apiextensions.k8s.io/v1", "CustomResourceDefinition", m.ELASTICJOB_CRD, None,
                    {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                    {"type": "Established", "status": "True"}]})
    kube.set_status("apps/v1", "StatefulSet", m.ETCD_NAME, NS, {"replicas": 1, "readyReplicas": 1})
    kube.set_status("apps/v1", "Deployment", m.OPERATOR_DEPLOYMENT, NS,
                    {"conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}]})
    kube.set_status("apps/v1", "DaemonSet", m.DEVICE_PLUGIN_DAEMONSET, NS,
                    {"desiredNumberScheduled": 2, "numberReady": 2})


def test_fake_kube_is_a_kube_client() -> None:
    client: KubeClient = FakeKube()  # noqa: F841  (type-checks the protocol)
    assert all(callable(getattr(FakeKube, verb)) for verb in ("apply", "get", "list", "delete"))


def test_install_applies_every_object_in_order_and_reports_it(kube) -> None:
    lines: list[str] = []
    summary = incluster.install(kube, SPEC, progress=lines.append)
    rendered = m.render_cluster_objects(SPEC)
    assert [(s["kind"], s["name"]) for s in summary] == [(o["kind"], o["metadata"]["name"]) for o in rendered]
    assert {s["action"] for s in summary} == {"created"}
    assert [c for c in kube.calls if c[0] == "apply"][:2] == [
        ("apply", "CustomResourceDefinition", None, m.ELASTICJOB_CRD), ("apply", "Namespace", None, NS)]
    assert lines[0] == f"CustomResourceDefinition {m.ELASTICJOB_CRD}: created" and len(lines) == len(rendered)


def test_install_twice_changes_nothing(kube) -> None:
    incluster.install(kube, SPEC)
    before = {k: v["metadata"]["resourceVersion"] for k, v in kube.objects.items()}
    summary = incluster.install(kube, SPEC)
    assert {s["action"] for s in summary} == {"unchanged"}
    assert {k: v["metadata"]["resourceVersion"] for k, v in kube.objects.items()} == before


def test_install_with_a_new_checkpoint_url_reconfigures_only_the_configmap(kube) -> None:
    incluster.install(kube, SPEC)
    moved = m.InClusterSpec(identity_client_id=SPEC.identity_client_id,
                            checkpoint_url="https://ckptstore02.blob.core.windows.net/checkpoints")
    changed = [(s["kind"], s["name"]) for s in incluster.install(kube, moved) if s["action"] != "unchanged"]
    assert changed == [("ConfigMap", m.CHECKPOINT_CONFIGMAP)]
    configmap = kube.get("v1", "ConfigMap", m.CHECKPOINT_CONFIGMAP, NS)
    assert configmap["data"][m.CHECKPOINT_URL_KEY] == moved.checkpoint_url


def test_install_keeps_the_status_the_cluster_wrote(kube) -> None:
    incluster.install(kube, SPEC)
    _healthy(kube)
    assert {s["action"] for s in incluster.install(kube, SPEC)} == {"unchanged"}
    assert incluster.health(kube, SPEC)["state"] == "ok"


def test_install_stops_at_the_first_refused_object(kube) -> None:
    kube.fail("apply", "StatefulSet", error=KubeError("apply StatefulSet failed: HTTP 403 Forbidden", status=403))
    with pytest.raises(KubeError) as caught:
        incluster.install(kube, SPEC)
    assert caught.value.status == 403
    assert kube.get("apps/v1", "Deployment", m.OPERATOR_DEPLOYMENT, NS) is None


def test_health_of_an_empty_cluster_is_missing_everywhere(kube) -> None:
    report = incluster.health(kube, SPEC)
    assert report["state"] == "missing"
    assert {c["state"] for c in report["components"].values()} == {"missing"}
    assert set(report["components"]) == {"elasticjob-crd", "etcd", "operator", "nvidia-device-plugin"}


def test_health_right_after_install_is_degraded_with_reasons(kube) -> None:
    incluster.install(kube, SPEC)
    report = incluster.health(kube, SPEC)
    components = report["components"]
    assert report["state"] == "degraded"
    assert components["etcd"] == {"state": "degraded", "reason": "0/1 replicas ready"}
    assert components["elasticjob-crd"] == {"state": "degraded", "reason": "not established yet"}
    assert components["operator"]["state"] == "degraded"
    # No GPU node yet is normal for a Spot pool that scales to zero.
    assert components["nvidia-device-plugin"]["state"] == "ok"


def test_health_when_everything_is_up(kube) -> None:
    incluster.install(kube, SPEC)
    _healthy(kube)
    report = incluster.health(kube, SPEC)
    assert report["state"] == "ok"
    assert report["components"]["nvidia-device-plugin"] == {"state": "ok", "reason": "2/2 GPU nodes ready"}


@pytest.mark.parametrize("component, kind, name, status, reason", [
    ("nvidia-device-plugin", "DaemonSet", m.DEVICE_PLUGIN_DAEMONSET,
     {"desiredNumberScheduled": 3, "numberReady": 1}, "1/3 GPU nodes ready"),
    ("operator", "Deployment", m.OPERATOR_DEPLOYMENT,
     {"conditions": [{"type": "Available", "status": "False", "message": "Deployment does not have minimum "
                                                                         "availability."}]},
     "not available: Deployment does not have minimum availability."),
    ("etcd", "StatefulSet", m.ETCD_NAME, {"replicas": 1, "readyReplicas": 0}, "0/1 replicas ready"),
])
def test_health_names_what_is_degraded(kube, component, kind, name, status, reason) -> None:
    incluster.install(kube, SPEC)
    _healthy(kube)
    kube.set_status("apps/v1", kind, name, NS, status)
    report = incluster.health(kube, SPEC)
    assert report["state"] == "degraded"
    assert report["components"][component] == {"state": "degraded", "reason": reason}
    assert [c for c, v in report["components"].items() if v["state"] != "ok"] == [component]


def test_health_when_the_crds_names_clash(kube) -> None:
    incluster.install(kube, SPEC)
    kube.set_status("apiextensions.k8s.io/v1", "CustomResourceDefinition", m.ELASTICJOB_CRD, None,
                    {"conditions": [{"type": "NamesAccepted", "status": "False", "reason": "ShortNameConflict",
                                     "message": "'ej' is already in use"}]})
    crd = incluster.health(kube, SPEC)["components"]["elasticjob-crd"]
    assert crd == {"state": "degraded", "reason": "names not accepted: 'ej' is already in use"}


def test_health_when_one_component_was_deleted(kube) -> None:
    incluster.install(kube, SPEC)
    _healthy(kube)
    assert kube.delete("apps/v1", "StatefulSet", m.ETCD_NAME, NS)
    report = incluster.health(kube, SPEC)
    assert report["state"] == "missing" and report["components"]["etcd"]["state"] == "missing"


# -- FakeKube itself (the other tests lean on it) ----------------------------------------------------------

def test_fake_kube_lists_by_namespace_and_label_and_seeds_nodes(kube) -> None:
    kube.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "aks-gpu-0", "labels": {
        "kubernetes.azure.com/scalesetpriority": "spot"}}, "spec": {"providerID": "azure:///x"}})
    kube.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "aks-system-0", "labels": {
        "kubernetes.azure.com/mode": "system"}}})
    spot = kube.list("v1", "Node", label_selector="kubernetes.azure.com/scalesetpriority=spot")
    assert [n["metadata"]["name"] for n in spot] == ["aks-gpu-0"]
    assert [n["metadata"]["name"] for n in kube.list("v1", "Node", label_selector="!kubernetes.azure.com/mode")] \
        == ["aks-gpu-0"]
    incluster.install(kube, SPEC)
    assert len(kube.list("v1", "ServiceAccount", NS)) == 2
    assert kube.list("v1", "ServiceAccount", "elsewhere") == []


def test_fake_kube_bumps_generation_only_when_the_spec_changes(kube) -> None:
    # a Deployment the API server takes: a selector that matches its template's labels
    spec = {"replicas": 1, "selector": {"matchLabels": {"app": "d"}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": NS}, "spec": spec}
    first = kube.apply(obj)
    labelled = kube.apply({**obj, "metadata": {**obj["metadata"], "labels": {"a": "b"}}})
    scaled = kube.apply({**obj, "spec": {**spec, "replicas": 2}})
    assert (first["metadata"]["generation"], labelled["metadata"]["generation"],
            scaled["metadata"]["generation"]) == (1, 1, 2)
    assert len({first["metadata"]["resourceVersion"], labelled["metadata"]["resourceVersion"],
                scaled["metadata"]["resourceVersion"]}) == 3


def test_fake_kube_needs_a_namespace_for_namespaced_kinds(kube) -> None:
    with pytest.raises(ValueError):
        kube.get("v1", "ConfigMap", "x")


K8S_JOB_SPEC = m.InClusterSpec(identity_client_id=SPEC.identity_client_id, checkpoint_url=SPEC.checkpoint_url,
                               engine="k8s-job")


def test_a_k8s_job_cluster_gets_everything_but_the_operator(kube) -> None:
    everything = {(o["kind"], o["metadata"]["name"]) for o in m.render_cluster_objects(SPEC)}
    summary = incluster.install(kube, K8S_JOB_SPEC)
    installed = {(s["kind"], s["name"]) for s in summary}
    assert everything - installed == {
        ("CustomResourceDefinition", m.ELASTICJOB_CRD), ("Deployment", m.OPERATOR_DEPLOYMENT),
        ("ServiceAccount", "elastictrain-operator"), ("ClusterRole", "elastictrain-elastic-job-controller"),
        ("ClusterRoleBinding", "elastictrain-elastic-job-controller"),
        ("Role", "elastictrain-elastic-job-controller-leader-election"),
        ("RoleBinding", "elastictrain-elastic-job-controller-leader-election")}
    assert installed < everything


def test_a_k8s_job_cluster_is_healthy_without_an_operator(kube) -> None:
    incluster.install(kube, K8S_JOB_SPEC)
    kube.set_status("apps/v1", "StatefulSet", m.ETCD_NAME, NS, {"replicas": 1, "readyReplicas": 1})
    kube.set_status("apps/v1", "DaemonSet", m.DEVICE_PLUGIN_DAEMONSET, NS, {"desiredNumberScheduled": 0})
    report = incluster.health(kube, K8S_JOB_SPEC)
    assert report["state"] == "ok" and set(report["components"]) == {"etcd", "nvidia-device-plugin"}
    assert kube.get("apps/v1", "Deployment", m.OPERATOR_DEPLOYMENT, NS) is None
