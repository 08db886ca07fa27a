"""clients.kube (the official kubernetes client behind our KubeClient) against the fake Kubernetes served on
loopback (tests/support/kube_apiserver.py), as a static-token, client-certificate or Entra ID-only API server."""
from __future__ import annotations

import base64
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from azext_elastictrain.clients import kube as kube_module
from azext_elastictrain.clients.kube import AKS_SCOPE, FIELD_MANAGER, KubeError, connect
from azext_elastictrain.core.aks.manifests import load_base_objects
from tests.support.kube_apiserver import entra_token, serve_kube_api, token_claims

TOKEN = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2VuLWZvci10ZXN0cw.c2lnbmF0dXJl"


def _configmap(name: str, data: dict, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "elastictrain", "labels": labels or {}}, "data": data}


@pytest.fixture
def api():
    with serve_kube_api(token=TOKEN) as server:
        yield server


@pytest.fixture
def client(api):
    with connect(api.kubeconfig()) as opened:
        yield opened


def test_apply_creates_then_updates_with_server_side_apply(api, client) -> None:
    created = client.apply(_configmap("settings", {"a": "1"}))
    updated = client.apply(_configmap("settings", {"a": "2"}))
    same = client.apply(_configmap("settings", {"a": "2"}))
    assert created["data"] == {"a": "1"} and updated["data"] == {"a": "2"}
    assert created["metadata"]["resourceVersion"] != updated["metadata"]["resourceVersion"]
    assert same["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]
    patches = [r for r in api.requests if r.method == "PATCH"]
    assert [r.path for r in patches] == ["/api/v1/namespaces/elastictrain/configmaps/settings"] * 3
    assert patches[0].query == {"fieldManager": [FIELD_MANAGER]}  # never force: conflicts are the user's to see
    assert patches[0].headers["Content-Type"] == "application/apply-patch+yaml"
    assert patches[0].headers["Authorization"] == f"Bearer {TOKEN}"
    assert json.loads(patches[0].body)["data"] == {"a": "1"}


def _crd() -> dict:
    return next(o for o in load_base_objects() if o["kind"] == "CustomResourceDefinition")


def test_apply_finds_the_path_of_other_groups_and_cluster_scoped_kinds(api, client) -> None:
    pods = {"selector": {"matchLabels": {"app": "etcd"}}, "serviceName": "etcd", "template": {
        "metadata": {"labels": {"app": "etcd"}}, "spec": {"containers": [{"name": "etcd", "image": "etcd"}]}}}
    client.apply({"apiVersion": "apps/v1", "kind": "StatefulSet",
                  "metadata": {"name": "etcd", "namespace": "elastictrain"}, "spec": {"replicas": 1, **pods}})
    client.apply(_crd())
    applied = [(r.path, r.status) for r in api.requests if r.method == "PATCH"]
    assert applied == [("/apis/apps/v1/namespaces/elastictrain/statefulsets/etcd", 201),
                       ("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/elasticjobs.elastic.pytorch.org",
                        201)]
    assert api.kube.get("apps/v1", "StatefulSet", "etcd", "elastictrain")["spec"]["replicas"] == 1


def test_get_returns_the_object_or_none_when_missing(client) -> None:
    client.apply(_configmap("settings", {"a": "1"}))
    assert client.get("v1", "ConfigMap", "settings", "elastictrain")["data"] == {"a": "1"}
    assert client.get("v1", "ConfigMap", "nope", "elastictrain") is None


def test_a_kind_the_cluster_does_not_serve_yet_is_absent_not_an_error(client) -> None:
    assert client.get("elastic.pytorch.org/v1alpha1", "ElasticJob", "job", "elastictrain") is None
    assert client.list("elastic.pytorch.org/v1alpha1", "ElasticJob", "elastictrain") == []
    assert client.delete("elastic.pytorch.org/v1alpha1", "ElasticJob", "job", "elastictrain") is False
    with pytest.raises(KubeError) as caught:
        client.apply({"apiVersion": "elastic.pytorch.org/v1alpha1", "kind": "ElasticJob",
                      "metadata": {"name": "job", "namespace": "elastictrain"}})
    assert caught.value.status == 404 and "CustomResourceDefinition" in str(caught.value)


def test_list_filters_by_label_and_follows_pages(api, client) -> None:
    api.page_size_cap = 2
    for i in range(5):
        client.apply(_configmap(f"cm-{i}", {"i": str(i)}, {"role": "even" if i % 2 == 0 else "odd"}))
    listed = client.list("v1", "ConfigMap", "elastictrain")
    assert [o["metadata"]["name"] for o in listed] == [f"cm-{i}" for i in range(5)]
    assert all(o["apiVersion"] == "v1" and o["kind"] == "ConfigMap" for o in listed)
    even = client.list("v1", "ConfigMap", "elastictrain", label_selector="role=even")
    assert [o["metadata"]["name"] for o in even] == ["cm-0", "cm-2", "cm-4"]
    assert len(client.list("v1", "ConfigMap")) == 5  # all namespaces
    assert sum(1 for r in api.requests if r.method == "GET" and r.path.endswith("/configmaps")) >= 3 + 2 + 3


def test_delete_reports_whether_there_was_something(api, client) -> None:
    client.apply(_configmap("settings", {"a": "1"}))
    assert client.delete("v1", "ConfigMap", "settings", "elastictrain") is True
    assert client.delete("v1", "ConfigMap", "settings", "elastictrain") is False
    deletes = [r for r in api.requests if r.method == "DELETE"]
    assert deletes[0].query == {"propagationPolicy": ["Background"]}


@pytest.mark.parametrize("status, reason, message, expected", [
    (403, "Forbidden", 'configmaps "settings" is forbidden: User "alice" cannot patch resource', "RBAC"),
    (422, "Invalid", 'ConfigMap "settings" is invalid: data[bad key]: Invalid value', "data[bad key]"),
])
def test_an_api_error_becomes_a_kube_error_with_a_clear_message_and_no_token(api, client, status, reason, message,
                                                                             expected) -> None:
    api.fail("PATCH", "/api/v1/namespaces/elastictrain/configmaps/settings", status, reason, message)
    with pytest.raises(KubeError) as caught:
        client.apply(_configmap("settings", {"a": "1"}))
    text = str(caught.value)
    assert caught.value.status == status and caught.value.reason == reason
    assert "ConfigMap elastictrain/settings" in text and message in text and expected in text
    assert TOKEN not in text and TOKEN not in repr(caught.value) and TOKEN not in repr(client)


def test_refused_credentials_are_a_401_without_the_token(api) -> None:
    client = connect(api.kubeconfig(token="wrong-" + TOKEN))
    with pytest.raises(KubeError) as caught:
        client.get("v1", "ConfigMap", "settings", "elastictrain")
    assert caught.value.status == 401 and "expired" in str(caught.value)
    assert "wrong-" not in str(caught.value) and TOKEN not in str(caught.value)


def test_an_unreachable_server_is_a_kube_error_without_a_status(api) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once closed
    kubeconfig = api.kubeconfig().replace(api.url.encode(), f"http://127.0.0.1:{port}".encode())
    with pytest.raises(KubeError) as caught:
        connect(kubeconfig).get("v1", "ConfigMap", "settings", "elastictrain")
    assert caught.value.status is None and "cannot reach" in str(caught.value) and TOKEN not in str(caught.value)


def test_a_broken_kubeconfig_is_refused_without_quoting_it() -> None:
    broken = f"users:\n- name: u\n  user:\n    token: {TOKEN}\n  - [unbalanced".encode()
    with pytest.raises(KubeError) as caught:
        connect(broken)
    assert TOKEN not in str(caught.value) and caught.value.__cause__ is None


def test_an_unknown_context_names_the_known_ones(api) -> None:
    with pytest.raises(KubeError, match="no context named 'other'.*test"):
        connect(api.kubeconfig(), context="other")


# -- TLS, client certificates, credential plugins ------------------------------------------------------------

@pytest.fixture
def private_tempdir(tmp_path: Path, monkeypatch) -> Path:
    """Where tempfile would write, so a test can see that nothing is left there."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _server_folder(tmp_path: Path) -> Path:
    (tmp_path / "server").mkdir(exist_ok=True)
    return tmp_path / "server"


def test_https_with_the_clusters_ca_and_a_token(tmp_path: Path) -> None:
    with serve_kube_api(token=TOKEN, tls_dir=_server_folder(tmp_path)) as api:
        client = connect(api.kubeconfig())
        client.apply(_configmap("settings", {"a": "1"}))
        assert client.get("v1", "ConfigMap", "settings", "elastictrain") is not None


@pytest.mark.parametrize("memfd", [True, False], ids=["memfd", "private-temp-folder"])
def test_a_client_certificate_authenticates_and_leaves_no_file(tmp_path, private_tempdir, monkeypatch, memfd) -> None:
    if not memfd:
        monkeypatch.delattr(os, "memfd_create", raising=False)
    elif not hasattr(os, "memfd_create"):
        pytest.skip("no memfd_create on this OS")
    with serve_kube_api(token=TOKEN, tls_dir=_server_folder(tmp_path)) as api:
        with connect(api.kubeconfig(use_token=False, client_cert=True)) as client:
            client.apply(_configmap("settings", {"a": "1"}))
            assert api.requests[-1].client_cert_subject == "test-user"
            assert "Authorization" not in api.requests[-1].headers
            if memfd:  # the key never reached a file system
                assert not any(p.is_file() for p in private_tempdir.rglob("*.pem"))
    assert list(private_tempdir.iterdir()) == []


def test_a_server_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    with serve_kube_api(token=TOKEN, tls_dir=_server_folder(tmp_path)) as api, \
            serve_kube_api(token=TOKEN, tls_dir=tmp_path / "other") as other:
        kubeconfig = json.loads(api.kubeconfig())
        kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"] = base64.b64encode(other.ca_pem).decode()
        with pytest.raises(KubeError) as caught:
            connect(json.dumps(kubeconfig).encode()).get("v1", "ConfigMap", "settings", "elastictrain")
    assert caught.value.status is None and "SSL" in str(caught.value) and TOKEN not in str(caught.value)


def test_a_field_another_manager_owns_is_a_clear_conflict_not_taken_over(api, client) -> None:
    client.apply(_configmap("settings", {"a": "1"}))
    api.kube.take_fields("v1", "ConfigMap", "settings", "elastictrain", "kubectl-edit", ["data.a"])
    with pytest.raises(KubeError) as caught:
        client.apply(_configmap("settings", {"a": "2"}))
    assert caught.value.status == 409 and "kubectl-edit" in str(caught.value) and "nothing was changed" in str(
        caught.value)
    assert client.get("v1", "ConfigMap", "settings", "elastictrain")["data"] == {"a": "1"}
    assert all("force" not in r.query for r in api.requests if r.method == "PATCH")


# -- Entra ID-only clusters: the login's token for the AKS server application ------------------------------------

class _Login:
    """A TokenCredential like the CLI's login: a cached token until renew() (or its expiry); records each ask."""

    def __init__(self, lifetime: float = 3600, audience: str | None = None) -> None:
        self.asked: list[tuple] = []
        self.renewed = 0
        self._lifetime, self._audience, self._cached = lifetime, audience, None

    def get_token(self, *scopes, **kwargs):
        self.asked.append(scopes)
        if self._cached is None or self._cached.expires_on - 300 <= time.time():
            audience = self._audience or scopes[0].removesuffix("/.default")
            self._cached = SimpleNamespace(token=entra_token(audience, lifetime=self._lifetime),
                                           expires_on=int(time.time() + self._lifetime))
        return self._cached

    def renew(self) -> None:
        self.renewed += 1
        self._cached = None


def _exec_kubeconfig(api) -> bytes:
    """What listClusterUserCredential gives for an Entra ID-only cluster: kubelogin, which is not installed here."""
    kubeconfig = json.loads(api.kubeconfig(use_token=False))
    kubeconfig["users"][0]["user"] = {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "kubelogin-not-installed",
        "args": ["get-token", "--server-id", "6dae42f8-4368-4678-94ff-3960e28e3630", "--login", "devicecode"]}}
    return json.dumps(kubeconfig).encode()


@pytest.fixture
def entra_api(tmp_path):
    with serve_kube_api(token=None, tls_dir=_server_folder(tmp_path), entra=True) as server:
        yield server


def test_an_entra_cluster_is_reached_with_the_logins_token_for_the_aks_server_app(entra_api) -> None:
    login = _Login()
    with connect(_exec_kubeconfig(entra_api), credential=login) as client:
        client.apply(_configmap("settings", {"a": "1"}))
        assert client.get("v1", "ConfigMap", "settings", "elastictrain")["data"] == {"a": "1"}
    assert AKS_SCOPE == "6dae42f8-4368-4678-94ff-3960e28e3630/.default"
    assert login.asked and set(login.asked) == {(AKS_SCOPE,)}
    sent = {token_claims(r.headers["Authorization"].split()[1])["aud"] for r in entra_api.requests}
    assert sent == {"6dae42f8-4368-4678-94ff-3960e28e3630"}
    assert all(r.status != 401 for r in entra_api.requests)


def test_an_entra_cluster_without_a_login_is_a_clear_error_and_runs_no_plugin(entra_api) -> None:
    with pytest.raises(KubeError, match="az login"):
        connect(_exec_kubeconfig(entra_api))


@pytest.mark.parametrize("how", ["client certificate", "no token", "another audience"])
def test_the_entra_api_server_refuses_what_is_not_an_aks_token(entra_api, how) -> None:
    if how == "client certificate":
        kubeconfig, login = entra_api.kubeconfig(use_token=False, client_cert=True), None
    elif how == "no token":
        kubeconfig, login = entra_api.kubeconfig(use_token=False), None
    else:
        kubeconfig, login = _exec_kubeconfig(entra_api), _Login(audience="https://management.azure.com")
    with connect(kubeconfig, credential=login) as client, pytest.raises(KubeError) as caught:
        client.get("v1", "ConfigMap", "settings", "elastictrain")
    assert caught.value.status == 401
    assert [r.status for r in entra_api.requests] == [401] * len(entra_api.requests)


def test_a_token_the_server_stops_taking_is_renewed_once_and_the_call_goes_on(entra_api) -> None:
    entra_api.expire_after_uses = 3
    login = _Login()
    with connect(_exec_kubeconfig(entra_api), credential=login) as client:
        for i in range(4):
            client.apply(_configmap(f"cm-{i}", {"i": str(i)}))
        assert len(client.list("v1", "ConfigMap", "elastictrain")) == 4
    statuses = [r.status for r in entra_api.requests]
    tokens = [token_claims(r.headers["Authorization"].split()[1])["jti"] for r in entra_api.requests]
    refused = [i for i, status in enumerate(statuses) if status == 401]
    assert refused and all(tokens[i] != tokens[i + 1] and statuses[i + 1] != 401 for i in refused)
    assert login.renewed == len(refused) and all(tokens.count(t) <= 4 for t in set(tokens))


def test_a_second_401_after_a_renewed_token_is_an_error(entra_api) -> None:
    entra_api.expire_after_uses = 0  # no token is ever taken
    login = _Login()
    with connect(_exec_kubeconfig(entra_api), credential=login) as client, pytest.raises(KubeError) as caught:
        client.get("v1", "ConfigMap", "settings", "elastictrain")
    assert caught.value.status == 401 and login.renewed == 1
    assert [r.status for r in entra_api.requests] == [401, 401]
    assert all(token_claims(r.headers["Authorization"].split()[1])["jti"] not in str(caught.value)
               for r in entra_api.requests)


def test_a_token_about_to_expire_is_replaced_before_it_is_sent(entra_api) -> None:
    login = _Login(lifetime=240)  # inside the 5-minute margin: asked again for every request
    with connect(_exec_kubeconfig(entra_api), credential=login) as client:
        client.get("v1", "ConfigMap", "a", "elastictrain")
        client.get("v1", "ConfigMap", "b", "elastictrain")
    jtis = {token_claims(r.headers["Authorization"].split()[1])["jti"] for r in entra_api.requests}
    assert len(jtis) == len(entra_api.requests) and all(r.status != 401 for r in entra_api.requests)


def test_a_watch_opened_with_a_token_the_server_stops_taking_is_renewed_once(entra_api) -> None:
    login = _Login()
    with connect(_exec_kubeconfig(entra_api), credential=login) as client:
        client.apply(_configmap("settings", {"a": "1"}))
        entra_api.expire_after_uses = 1  # every token from now on: refused at its second request
        client.get("v1", "ConfigMap", "settings", "elastictrain")  # the login's token's second use: renewed
        events = [(kind, obj["data"]["a"]) for kind, obj in client.watch("v1", "ConfigMap", "settings",
                                                                         "elastictrain", timeout=1)]
    assert events[:1] == [("ADDED", "1")]
    watched = [r for r in entra_api.requests if r.query.get("watch")]
    assert [r.status for r in watched] == [401, 200] and login.renewed == 2
    tokens = [token_claims(r.headers["Authorization"].split()[1])["jti"] for r in watched]
    assert tokens[0] != tokens[1]


# -- watch and followed logs -------------------------------------------------------------------------------------

def _pod(api, name: str, log: str, container: str | None = None) -> None:
    """A pod that ran (a log of a pod that is not there is a 404) and what it printed."""
    api.kube.seed({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "elastictrain"}})
    api.kube.set_logs(name, "elastictrain", log, container)


def test_watch_sees_the_object_then_its_changes_until_the_timeout(api, client) -> None:
    client.apply(_configmap("settings", {"a": "1"}))

    def change_later() -> None:
        time.sleep(0.3)
        with connect(api.kubeconfig()) as other:
            other.apply(_configmap("settings", {"a": "2"}))

    threading.Thread(target=change_later, daemon=True).start()
    started = time.monotonic()
    events = [(kind, obj["data"]["a"]) for kind, obj in client.watch("v1", "ConfigMap", "settings", "elastictrain",
                                                                     timeout=2)]
    assert events[:2] == [("ADDED", "1"), ("MODIFIED", "2")]
    assert 1.5 < time.monotonic() - started < 10
    watched = [r for r in api.requests if r.query.get("watch")]
    assert watched[0].query["fieldSelector"] == ["metadata.name=settings"]
    assert watched[0].query["timeoutSeconds"] == ["2"]


def test_a_followed_log_that_goes_silent_is_opened_again_without_repeating_lines(api, client, monkeypatch) -> None:
    monkeypatch.setattr(kube_module, "FOLLOW_READ_TIMEOUT_S", 0.5)
    _pod(api, "job-worker-0", "".join(f"line {i}\n" for i in range(7)))
    api.log_stall = 6.0  # the first connection sends the lines, then nothing (far past the read timeout)
    lines = client.pod_logs("job-worker-0", "elastictrain", follow=True)
    first = [next(lines) for _ in range(7)]
    api.kube.set_logs("job-worker-0", "elastictrain", "".join(f"line {i}\n" for i in range(9)))
    api.log_stall = 0.0
    assert first + list(lines) == [f"line {i}" for i in range(9)]
    logs = [r for r in api.requests if r.path.endswith("/log")]
    assert len(logs) == 2 and int(logs[1].query["sinceSeconds"][0]) > 0
    assert all(r.query["timestamps"] == ["true"] for r in logs)


def test_pod_logs_stream_the_lines_of_a_container(api, client) -> None:
    _pod(api, "job-worker-0", "step 1\nstep 2\r\nstep 3", container="worker")
    assert list(client.pod_logs("job-worker-0", "elastictrain", container="worker")) == [
        "step 1", "step 2", "step 3"]
    asked = api.requests[-1]
    assert asked.path == "/api/v1/namespaces/elastictrain/pods/job-worker-0/log"
    assert asked.query == {"container": ["worker"]}


def test_pod_logs_ask_for_the_tail_and_to_follow(api, client) -> None:
    _pod(api, "job-worker-1", "".join(f"line {i}\n" for i in range(10)))
    assert list(client.pod_logs("job-worker-1", "elastictrain", follow=True, tail=2)) == ["line 8", "line 9"]
    assert api.requests[-1].query == {"follow": ["true"], "tailLines": ["2"], "timestamps": ["true"]}


def test_the_log_of_a_missing_pod_is_a_404_kube_error_at_the_call(api, client) -> None:
    with pytest.raises(KubeError) as raised:
        client.pod_logs("nothere", "elastictrain")
    assert raised.value.status == 404 and "nothere" in str(raised.value) and TOKEN not in str(raised.value)


# -- what the API server refuses -----------------------------------------------------------------------------------

@pytest.mark.parametrize("obj, field, status, text", [
    # a ConfigMap has no spec: server-side apply cannot type the body (tests/support/fake_workloads.py)
    ({**_configmap("settings", {"a": "1"}), "spec": {"replicas": 1}}, "spec", 500, "field not declared in schema"),
    ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "Job_1", "namespace": "elastictrain"},
      "spec": {"clusterIP": "None"}}, "metadata.name", 422, "invalid"),  # not a DNS-1035 label
    (_configmap("settings", {"a": 1}), "data.a", 422, "invalid"),  # a ConfigMap's data are strings
])
def test_an_object_the_api_server_would_refuse_is_refused_naming_the_field(
        api, client, obj, field, status, text) -> None:
    with pytest.raises(KubeError) as caught:
        client.apply(obj)
    assert caught.value.status == status and text in str(caught.value)
    assert api.requests[-1].status == status and api.kube.get("v1", obj["kind"], obj["metadata"]["name"],
                                                              "elastictrain") is None
    assert field.split(".")[-1] in str(caught.value)


def test_an_apply_of_a_stale_resource_version_is_a_409_and_changes_nothing(api, client) -> None:
    first = client.apply(_configmap("settings", {"a": "1"}))
    client.apply(_configmap("settings", {"a": "2"}))
    stale = _configmap("settings", {"a": "3"})
    stale["metadata"]["resourceVersion"] = first["metadata"]["resourceVersion"]
    with pytest.raises(KubeError) as caught:
        client.apply(stale)
    assert caught.value.status == 409 and "modified" in str(caught.value)
    assert client.get("v1", "ConfigMap", "settings", "elastictrain")["data"] == {"a": "2"}


def test_a_custom_kind_is_served_once_its_crd_is_applied_and_checked_against_its_schema(api, client) -> None:
    job = {"apiVersion": "elastic.pytorch.org/v1alpha1", "kind": "ElasticJob",
           "metadata": {"name": "job", "namespace": "elastictrain"}, "spec": {"unknownField": 1}}
    assert client.get("elastic.pytorch.org/v1alpha1", "ElasticJob", "job", "elastictrain") is None
    client.apply(_crd())
    with pytest.raises(KubeError) as caught:
        client.apply(job)
    assert caught.value.status == 422 and "rdzvEndpoint" in str(caught.value)  # the CRD's required field
