"""The in-cluster objects: valid for Kubernetes 1.30+, our ElasticJob CRD structural, placement and pinning right.

There is no API server here: objects are checked against the official schemas (kubernetes-validate) and
ElasticJobs against our CRD's openAPIV3Schema (jsonschema).
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.spec import SpecError

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_DIR = REPO_ROOT / "azext_elastictrain" / "manifests"
# The oldest Kubernetes AKS still runs that we promise, and the newest schema the validator knows.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CLIENT_ID = "3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8"
TENANT_ID = "72f988bf-86f1-41af-91ab-2d7cd011db47"
SPEC = m.InClusterSpec(identity_client_id=CLIENT_ID, tenant_id=TENANT_ID,
                       checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return m.render_cluster_objects(SPEC)


def _one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _crd_schema(objects: list[dict]) -> dict:
    (version,) = _one(objects, "CustomResourceDefinition")["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def sample_elastic_job() -> dict:
    """Upstream's imagenet sample, adapted: our etcd service, Spot GPU placement, workload identity."""
    return {
        "apiVersion": "elastic.pytorch.org/v1alpha1", "kind": "ElasticJob",
        "metadata": {"name": "imagenet", "namespace": "elastictrain"},
        "spec": {
            "rdzvEndpoint": "elastictrain-etcd.elastictrain.svc.cluster.local:2379",
            "minReplicas": 1, "maxReplicas": 2,
            "replicaSpecs": {"Worker": {"replicas": 2, "restartPolicy": "ExitCode", "template": {
                "metadata": {"labels": {**m.WORKER_LABELS, "azure.workload.identity/use": "true"}},
                "spec": {
                    "serviceAccountName": "elastictrain-training",
                    "tolerations": [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal",
                                     "value": "spot", "effect": "NoSchedule"},
                                    {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
                    "containers": [{"name": "elasticjob-worker", "image": "torchelastic/examples:0.2.0",
                                    "args": ["--nproc_per_node=1", "/workspace/examples/imagenet/main.py",
                                             "--arch=resnet18", "--epochs=20", "--batch-size=32", "--workers=0",
                                             "/workspace/data/tiny-imagenet-200"],
                                    "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}},
        },
    }


# -- schemas -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_validates_against_the_official_kubernetes_schema(objects, version) -> None:
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as ex:
            pytest.fail(f"{m.object_key(obj)} is not valid on Kubernetes {version}: {ex.message} at "
                        f"{'.'.join(map(str, ex.path))}")


def test_the_official_schema_catches_a_broken_object(objects) -> None:  # the check above can fail
    etcd = copy.deepcopy(_one(objects, "StatefulSet", m.ETCD_NAME))
    etcd["spec"]["template"]["spec"]["containers"][0]["args"] = "--enable-v2=true"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(etcd, KUBERNETES_VERSIONS[0], strict=True)
    crd = copy.deepcopy(_one(objects, "CustomResourceDefinition"))
    crd["spec"]["validation"] = crd["spec"]["versions"][0].pop("schema")  # v1beta1's shape
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(crd, KUBERNETES_VERSIONS[0], strict=True)


def test_the_crd_is_apiextensions_v1_and_validates_as_a_crd(objects) -> None:
    crd = _one(objects, "CustomResourceDefinition")
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"  # v1beta1 is gone since Kubernetes 1.22
    assert crd["metadata"]["name"] == "elasticjobs.elastic.pytorch.org"
    assert crd["spec"]["group"] == "elastic.pytorch.org" and crd["spec"]["names"]["kind"] == "ElasticJob"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    kubernetes_validate.validate(crd, KUBERNETES_VERSIONS[0], strict=True)


def _structural_problems(schema: dict, path: str = "") -> list[str]:
    """The apiextensions v1 rules a schema breaks: every node typed (or preserving unknown fields), no
    properties beside additionalProperties, metadata below the root only as a plain object."""
    problems = []
    if "type" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields") \
            and not schema.get("x-kubernetes-int-or-string"):
        problems.append(f"{path or '<root>'}: no type")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{path}: properties and additionalProperties together")
    for banned in ("$ref", "definitions", "dependencies", "patternProperties", "uniqueItems"):
        if banned in schema:
            problems.append(f"{path}: {banned} is not allowed")
    for name, sub in (schema.get("properties") or {}).items():
        problems += _structural_problems(sub, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += _structural_problems(schema["additionalProperties"], f"{path}.*")
    if isinstance(schema.get("items"), dict):
        problems += _structural_problems(schema["items"], f"{path}[]")
    return problems


def test_the_crd_schema_is_structural(objects) -> None:
    schema = _crd_schema(objects)
    assert _structural_problems(schema) == []
    assert schema["properties"]["metadata"] == {"type": "object"}  # the root may not restrict metadata further
    template = schema["properties"]["spec"]["properties"]["replicaSpecs"]["properties"]["Worker"]["properties"][
        "template"]
    assert template["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"] is True


def test_the_crd_has_the_fields_the_controller_reads(objects) -> None:
    spec = _crd_schema(objects)["properties"]["spec"]
    assert set(spec["required"]) == {"rdzvEndpoint", "replicaSpecs"}
    assert {"rdzvEndpoint", "minReplicas", "maxReplicas", "replicaSpecs"} <= set(spec["properties"])
    worker = spec["properties"]["replicaSpecs"]["properties"]["Worker"]["properties"]
    assert {"replicas", "restartPolicy", "template"} <= set(worker)
    assert "ExitCode" in worker["restartPolicy"]["enum"]


def test_the_crd_has_no_status_subresource_because_the_controller_writes_status_with_update(objects) -> None:
    (version,) = _one(objects, "CustomResourceDefinition")["spec"]["versions"]
    assert "status" not in (version.get("subresources") or {})
    assert "status" in _crd_schema(objects)["properties"]


def test_a_sample_elastic_job_validates_against_our_crd(objects) -> None:
    jsonschema.Draft7Validator(_crd_schema(objects)).validate(sample_elastic_job())


def _without(job: dict, *path: str) -> dict:
    job = copy.deepcopy(job)
    node = job
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return job


def _with(job: dict, value, *path: str) -> dict:
    job = copy.deepcopy(job)
    node = job
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return job


@pytest.mark.parametrize("broken, why", [
    (_with(sample_elastic_job(), "1", "spec", "minReplicas"), "minReplicas as a string"),
    (_with(sample_elastic_job(), 0, "spec", "minReplicas"), "minReplicas below 1"),
    (_without(sample_elastic_job(), "spec", "replicaSpecs"), "no replicaSpecs"),
    (_without(sample_elastic_job(), "spec", "rdzvEndpoint"), "no rdzvEndpoint"),
    (_with(sample_elastic_job(), {}, "spec", "replicaSpecs"), "no Worker"),
    (_with(sample_elastic_job(), "Sometimes", "spec", "replicaSpecs", "Worker", "restartPolicy"), "restartPolicy"),
    (_with(sample_elastic_job(), [], "spec", "replicaSpecs", "Worker", "template", "spec", "containers"),
     "no containers"),
])
def test_an_invalid_elastic_job_fails_our_crd(objects, broken, why) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(_crd_schema(objects)).validate(broken)


def test_the_sample_jobs_pod_template_validates_against_the_official_schema() -> None:
    template = sample_elastic_job()["spec"]["replicaSpecs"]["Worker"]["template"]
    pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "worker"}, "template": template}
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(pod_template, version, strict=True)


# -- what the objects say --------------------------------------------------------------------------------

def _containers(obj: dict) -> list[dict]:
    return obj["spec"]["template"]["spec"]["containers"]


def test_objects_apply_crd_and_namespace_first(objects) -> None:
    assert [o["kind"] for o in objects[:2]] == ["CustomResourceDefinition", "Namespace"]


def test_every_namespaced_object_lands_in_the_specs_namespace() -> None:
    spec = m.InClusterSpec(namespace="team-a", service_account="trainer", identity_client_id=CLIENT_ID,
                           checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
    objects = m.render_cluster_objects(spec)
    assert _one(objects, "Namespace")["metadata"]["name"] == "team-a"
    namespaces = {o["metadata"].get("namespace") for o in objects
                  if o["kind"] not in ("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding")}
    assert namespaces == {"team-a"}
    subjects = [s for o in objects for s in o.get("subjects", [])]
    assert subjects and {s["namespace"] for s in subjects} == {"team-a"}
    assert _one(objects, "ServiceAccount", "trainer")["metadata"]["annotations"][m.CLIENT_ID_ANNOTATION] == CLIENT_ID


def test_the_training_service_account_carries_the_identitys_client_and_tenant_ids(objects) -> None:
    annotations = _one(objects, "ServiceAccount", SPEC.service_account)["metadata"]["annotations"]
    assert annotations == {m.CLIENT_ID_ANNOTATION: CLIENT_ID, m.TENANT_ID_ANNOTATION: TENANT_ID}


def test_the_configmap_holds_the_checkpoint_url(objects) -> None:
    assert _one(objects, "ConfigMap")["data"] == {m.CHECKPOINT_URL_KEY: SPEC.checkpoint_url}


def test_etcd_is_3_5_with_the_v2_api_on_the_system_pool(objects) -> None:
    etcd = _one(objects, "StatefulSet", m.ETCD_NAME)
    (container,) = _containers(etcd)
    assert re.fullmatch(r"(quay\.io/coreos|registry\.k8s\.io|gcr\.io/etcd-development)/etcd:v?3\.5\.\d+(-\d+)?"
                        r"(@sha256:[0-9a-f]{64})?", container["image"]), container["image"]
    assert "--enable-v2=true" in container["args"]
    assert etcd["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.azure.com/mode": "system"}
    service = _one(objects, "Service", m.ETCD_NAME)
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"][0]["port"] == m.ETCD_CLIENT_PORT
    assert service["spec"]["selector"].items() <= etcd["spec"]["template"]["metadata"]["labels"].items()


def test_the_network_policy_admits_only_training_workers_to_etcd(objects) -> None:
    policy = _one(objects, "NetworkPolicy")
    etcd_labels = _one(objects, "StatefulSet", m.ETCD_NAME)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= etcd_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": m.WORKER_LABELS}}]  # this namespace, workers only
    assert rule["ports"] == [{"protocol": "TCP", "port": m.ETCD_CLIENT_PORT}]
    for obj in objects:  # nothing else we run carries the worker labels
        if obj["kind"] in ("StatefulSet", "Deployment", "DaemonSet"):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert not m.WORKER_LABELS.items() <= labels.items(), m.object_key(obj)


def _tolerates(pod_spec: dict, taint: str) -> bool:
    key, rest = taint.split("=", 1)
    value, effect = rest.split(":")
    return any(t.get("key") == key and t.get("effect") in (effect, None)
               and (t.get("operator") == "Exists" or t.get("value") == value) for t in pod_spec.get("tolerations", []))


def test_the_device_plugin_tolerates_spot_and_gpu_taints_and_runs_on_gpu_nodes_only(objects) -> None:
    plugin = _one(objects, "DaemonSet", m.DEVICE_PLUGIN_DAEMONSET)
    pod = plugin["spec"]["template"]["spec"]
    assert _tolerates(pod, m.SPOT_TAINT) and _tolerates(pod, m.GPU_TAINT)
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.azure.com/accelerator", "operator": "In",
                                         "values": ["nvidia"]}]
    assert _containers(plugin)[0]["image"].startswith("nvcr.io/nvidia/k8s-device-plugin:v0.17.1@sha256:")


def test_a_different_gpu_taint_replaces_the_default_toleration() -> None:
    spec = m.InClusterSpec(identity_client_id=CLIENT_ID, checkpoint_url=SPEC.checkpoint_url,
                           gpu_taint="nvidia.com/gpu-pool=t4:NoExecute")
    pod = _one(m.render_cluster_objects(spec), "DaemonSet")["spec"]["template"]["spec"]
    assert _tolerates(pod, "nvidia.com/gpu-pool=t4:NoExecute") and _tolerates(pod, m.SPOT_TAINT)
    assert not any(t.get("key") == "sku" for t in pod["tolerations"])


def test_the_operator_runs_on_the_system_pool_with_its_own_account(objects) -> None:
    deployment = _one(objects, "Deployment", m.OPERATOR_DEPLOYMENT)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.azure.com/mode": "system"}
    binding = _one(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": SPEC.namespace}]
    role = _one(objects, "ClusterRole", binding["roleRef"]["name"])
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert {("", "pods"), ("", "services"), ("elastic.pytorch.org", "elasticjobs")} <= granted


def test_nothing_we_run_lands_on_spot_nodes_but_the_device_plugin(objects) -> None:
    for obj in objects:
        if obj["kind"] in ("StatefulSet", "Deployment"):
            assert not _tolerates(obj["spec"]["template"]["spec"], m.SPOT_TAINT), m.object_key(obj)


#: Images pinned by the digest their publisher's registry serves for the tag, as public deployments pin them
#: (device plugin v0.17.1: a public deployment lock file). A digest is never made up: an image with none found
#: stays on its tag, listed in UNPINNED.
DIGESTS = {
    "nvcr.io/nvidia/k8s-device-plugin:v0.17.1":
        "sha256:af31e2b7c7f89834c4e5219860def7ac2e49a207b3d4e8610d5a26772b7738e5",
}
#: The TorchElastic operator image (archived upstream): no published digest of 0.1.0 was found in public sources.
#: etcd v3.5.29, the newest 3.5 patch (3.5.17 had a published digest, but is 12 patches behind): none found yet.
UNPINNED = {"docker.io/torchelastic/kubernetes:0.1.0", "quay.io/coreos/etcd:v3.5.29"}


def test_every_image_is_pinned_by_digest_but_the_listed_ones(objects) -> None:
    images = [c["image"] for o in objects if o["kind"] in ("StatefulSet", "Deployment", "DaemonSet")
              for c in _containers(o)]
    assert len(images) == 3
    for image in images:
        name, _, tag = image.split("@")[0].rpartition(":")
        assert name and "/" not in tag and tag not in ("", "latest"), f"{image} is not pinned to a version"
        assert re.search(r"\d", tag), image
    pinned = {i.split("@")[0]: i.split("@")[1] for i in images if "@" in i}
    assert pinned == DIGESTS, "each digest is the one published for its tag"
    assert {i for i in images if "@" not in i} == UNPINNED, "a new image must come pinned by its digest"


# -- spec validation -------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("namespace", "Elastic_Train"), ("namespace", ""), ("service_account", "-sa"),
    ("identity_client_id", "not-a-guid"), ("tenant_id", "contoso.onmicrosoft.com"),
    ("checkpoint_url", "http://ckptstore01.blob.core.windows.net/checkpoints"),
    ("checkpoint_url", "https://ckptstore01.blob.core.windows.net/"),
    ("checkpoint_url", "https://ckptstore01.blob.core.windows.net/checkpoints/job-1"),
    ("checkpoint_url", "https://example.com/checkpoints"),
    ("gpu_taint", "sku=gpu"), ("gpu_taint", "sku=gpu:Sometimes"),
])
def test_a_bad_spec_value_is_refused(field, value) -> None:
    with pytest.raises(SpecError):
        m.InClusterSpec(**{"identity_client_id": CLIENT_ID, "checkpoint_url": SPEC.checkpoint_url, field: value})


@pytest.mark.parametrize("url", [
    "https://ckptstore01.blob.core.chinacloudapi.cn/checkpoints",  # a sovereign cloud
    "https://ckptstore01.blob.core.usgovcloudapi.net/checkpoints",
    "https://ckptstore01.z12.blob.storage.azure.net/checkpoints",  # an account in a DNS zone
    "https://127.0.0.1:10000/devstoreaccount1/checkpoints",  # Azurite over HTTPS: the account in the path
])
def test_checkpoint_urls_of_other_clouds_and_dns_zones_are_valid(url) -> None:
    assert m.validate_checkpoint_url(url) == url


def test_a_checkpoint_url_with_a_sas_is_refused_without_echoing_it() -> None:
    sas = "sv=2024-11-04&ss=b&srt=co&sp=rwdl&se=2030-01-01T00:00:00Z&sig=notarealsig"  # a SAS's shape, no secret
    with pytest.raises(SpecError) as caught:
        m.InClusterSpec(identity_client_id=CLIENT_ID,
                        checkpoint_url=f"https://ckptstore01.blob.core.windows.net/checkpoints?{sas}")
    assert "sig=" not in str(caught.value) and "notarealsig" not in str(caught.value)


def test_rendered_objects_carry_no_secret(objects) -> None:
    text = json.dumps(objects)
    for marker in ("BEGIN ", "PRIVATE KEY", "AccountKey", "SharedAccessSignature", "sig=", "client-key-data",
                   "token:", "password"):
        assert marker not in text
    assert not any(o["kind"] == "Secret" for o in objects)


def test_rendering_does_not_change_the_shipped_objects() -> None:
    before = m.load_base_objects()
    m.render_cluster_objects(SPEC)
    assert m.load_base_objects() == before


# -- the kustomize base ------------------------------------------------------------------------------------

def test_the_packaged_kustomization_lists_every_manifest_once() -> None:
    kustomization = yaml.safe_load((BASE_DIR / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = kustomization["resources"]
    on_disk = sorted(p.name for p in BASE_DIR.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk and len(set(listed)) == len(listed)


def test_the_repository_manifests_folder_is_a_base_over_the_packaged_objects() -> None:
    top = REPO_ROOT / "manifests"
    kustomization = yaml.safe_load((top / "kustomization.yaml").read_text(encoding="utf-8"))
    assert [(top / r).resolve() for r in kustomization["resources"]] == [BASE_DIR.resolve()]
    assert not list(top.glob("*.y*ml"))[1:], "manifests/ holds only kustomization.yaml: no second copy"
    base = {(o["kind"], o["metadata"]["name"]): o for o in m.load_base_objects()}
    for patch in kustomization["patches"]:
        target = base[(patch["target"]["kind"], patch["target"]["name"])]
        for op in yaml.safe_load(patch["patch"]):
            node = target
            for part in op["path"].strip("/").split("/"):
                node = node[part.replace("~1", "/").replace("~0", "~")]  # the field the patch sets exists


def test_the_manifests_ship_as_package_data() -> None:
    setup_py = (REPO_ROOT / "setup.py").read_text(encoding="utf-8")
    assert '"manifests/*.yaml"' in setup_py
