"""clients.kube's real client against a tiny Kubernetes API server on loopback (tests/support/kube_apiserver.py)."""
from __future__ import annotations

import base64
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import pytest

from azext_elastictrain.clients.kube import FIELD_MANAGER, KubeError, connect
from tests.support.kube_apiserver import serve_kube_api

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
    return connect(api.kubeconfig())


def test_apply_creates_then_updates_with_server_side_apply(api, client) -> None:
    created = client.apply(_configmap("settings", {"a": "1"}))
    updated = client.apply(_configmap("settings", {"a": "2"}))
    same = client.apply(_configmap("settings", {"a": "2"}))
    assert created["data"] == {"a": "1"} and updated["data"] == {"a": "2"}
    assert created["metadata"]["resourceVersion"] != updated["metadata"]["resourceVersion"]
    assert same["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]
    patches = [r for r in api.requests if r.method == "PATCH"]
    assert [r.path for r in patches] == ["/api/v1/namespaces/elastictrain/configmaps/settings"] * 3
    assert patches[0].query == {"fieldManager": [FIELD_MANAGER], "force": ["true"]}
    assert patches[0].headers["Content-Type"] == "application/apply-patch+yaml"
    assert patches[0].headers["Authorization"] == f"Bearer {TOKEN}"
    assert json.loads(patches[0].body)["data"] == {"a": "1"}


def test_apply_finds_the_path_of_other_groups_and_cluster_scoped_kinds(api, client) -> None:
    client.apply({"apiVersion": "apps/v1", "kind": "StatefulSet",
                  "metadata": {"name": "etcd", "namespace": "elastictrain"}, "spec": {"replicas": 1}})
    client.apply({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                  "metadata": {"name": "elasticjobs.elastic.pytorch.org"}, "spec": {}})
    assert "/apis/apps/v1/namespaces/elastictrain/statefulsets/etcd" in api.objects
    assert "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/elasticjobs.elastic.pytorch.org" in api.objects


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
        client = connect(api.kubeconfig(use_token=False, client_cert=True))
        client.apply(_configmap("settings", {"a": "1"}))
        assert api.requests[-1].client_cert_subject == "test-user"
        assert "Authorization" not in api.requests[-1].headers
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


def test_a_credential_plugin_gives_the_token(api, tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import json, os\n"
                      "assert json.loads(os.environ['KUBERNETES_EXEC_INFO'])['kind'] == 'ExecCredential'\n"
                      "print(json.dumps({'kind': 'ExecCredential', 'status': {'token': os.environ['T']}}))\n")
    kubeconfig = json.loads(api.kubeconfig(use_token=False))
    kubeconfig["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                               "command": sys.executable, "args": [str(plugin)],
                                               "env": [{"name": "T", "value": TOKEN}]}}
    client = connect(json.dumps(kubeconfig).encode())
    client.apply(_configmap("settings", {"a": "1"}))
    assert api.requests[-1].headers["Authorization"] == f"Bearer {TOKEN}"


def test_a_failing_credential_plugin_is_a_kube_error(api, tmp_path: Path) -> None:
    kubeconfig = json.loads(api.kubeconfig(use_token=False))
    kubeconfig["users"][0]["user"] = {"exec": {"command": str(tmp_path / "kubelogin-not-installed")}}
    with pytest.raises(KubeError, match="kubelogin"):
        connect(json.dumps(kubeconfig).encode())


def test_pod_logs_stream_the_lines_of_a_container(api, client) -> None:
    api.logs[("elastictrain", "job-worker-0", "worker")] = "step 1\nstep 2\r\nstep 3"
    assert list(client.pod_logs("job-worker-0", "elastictrain", container="worker")) == [
        "step 1", "step 2", "step 3"]
    asked = api.requests[-1]
    assert asked.path == "/api/v1/namespaces/elastictrain/pods/job-worker-0/log"
    assert asked.query == {"container": ["worker"]}


def test_pod_logs_ask_for_the_tail_and_to_follow(api, client) -> None:
    api.logs[("elastictrain", "job-worker-1", None)] = "".join(f"line {i}\n" for i in range(10))
    assert list(client.pod_logs("job-worker-1", "elastictrain", follow=True, tail=2)) == ["line 8", "line 9"]
    assert api.requests[-1].query == {"follow": ["true"], "tailLines": ["2"]}


def test_the_log_of_a_missing_pod_is_a_404_kube_error_at_the_call(api, client) -> None:
    with pytest.raises(KubeError) as raised:
        client.pod_logs("nothere", "elastictrain")
    assert raised.value.status == 404 and "nothere" in str(raised.value) and TOKEN not in str(raised.value)
