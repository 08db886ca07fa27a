"""The one module that talks to the Kubernetes API; everything above it sees only :class:`KubeClient`.

``connect(kubeconfig)`` takes the kubeconfig az got from the cluster (``listClusterUserCredentials``) as bytes
and keeps its credentials in memory: the client certificate is loaded into the TLS context from an anonymous
in-memory file where the OS has one (Linux ``memfd``), else from a private temporary folder removed at once.
Nothing here writes a kubeconfig; merging one into ``~/.kube/config`` is the user's explicit choice elsewhere.

Plain REST over urllib3 (what ``requests`` in az's Python is built on): server-side apply, get, list, delete,
with the resource's path found through API discovery. No new dependency, no SDK import at load time, and a
TLS context we build ourselves (the ``kubernetes`` package is not in az's Python and writes certificate data
to temporary files that stay until the process exits).

Errors are :class:`KubeError` with the HTTP status; their messages never carry a token, key or certificate.
"""
from __future__ import annotations

import base64
import json
import os
from typing import Any, Iterator, Protocol
from urllib.parse import quote, urlencode, urlsplit

FIELD_MANAGER = "elastictrain"
_CONNECT_TIMEOUT_S = 10.0
_READ_TIMEOUT_S = 60.0
_PAGE_SIZE = 500
_EXEC_TIMEOUT_S = 120
_HINTS = {
    401: " (the cluster refused the credentials; they may have expired: fetch them again)",
    403: " (the signed-in identity lacks Kubernetes RBAC rights for this; on Entra ID clusters it needs e.g. "
         "the 'Azure Kubernetes Service RBAC Cluster Admin' role)",
    409: " (someone changed it at the same time; run the command again)",
    422: " (the API server rejected the object as invalid)",
}


class KubeError(RuntimeError):
    """A Kubernetes API call that failed: ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class KubeClient(Protocol):
    """What the extension needs from a cluster. ``obj``s are plain dicts in the REST shape."""

    def apply(self, obj: dict) -> dict:
        """Create or update (server-side apply, field manager ``elastictrain``); idempotent."""

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        """The object, or None where it (or its kind) does not exist."""

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict]:
        """Objects of a kind (all namespaces when ``namespace`` is None), each with apiVersion and kind."""

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        """Delete (dependents in the background); False where there was nothing to delete."""

    def pod_logs(self, name: str, namespace: str, container: str | None = None, follow: bool = False,
                 tail: int | None = None) -> Iterator[str]:
        """The lines of a pod's (container's) log, without their line ends; the last ``tail`` only when
        given. ``follow``: keep yielding new lines until the container exits. A missing pod raises
        :class:`KubeError` (status 404) at the call, not at the first line."""


def connect(kubeconfig: bytes, context: str | None = None) -> KubeClient:
    """A client for ``context`` (default: the kubeconfig's current context), credentials kept in memory."""
    cluster, user = _select_context(kubeconfig, context)
    secrets = [str(user.get(k)) for k in ("token", "client-certificate-data", "client-key-data") if user.get(k)]
    token = user.get("token")
    if not token and user.get("exec"):
        token = _exec_credential_token(user["exec"])
        secrets.append(token)
    server = cluster.get("server") or ""
    if urlsplit(server).scheme not in ("https", "http") or not urlsplit(server).hostname:
        raise KubeError("the kubeconfig's cluster has no https:// server address")
    ssl_context = _tls_context(cluster, user) if server.startswith("https:") else None
    return HttpKubeClient(server, ssl_context, token=token, secrets=secrets,
                          server_hostname=cluster.get("tls-server-name"))


def _select_context(kubeconfig: bytes, context: str | None) -> tuple[dict, dict]:
    import yaml  # PyYAML: azure-cli ships it

    try:
        doc = yaml.safe_load(kubeconfig)
    except yaml.YAMLError:
        # No chaining: the parser's message quotes the text around the error, credentials included.
        raise KubeError("the kubeconfig is not valid YAML") from None
    if not isinstance(doc, dict):
        raise KubeError("the kubeconfig is not a kubeconfig (no clusters, users and contexts)")
    name = context or doc.get("current-context")
    ctx = _named(doc, "contexts", name, "context")
    return _named(doc, "clusters", ctx.get("cluster"), "cluster"), _named(doc, "users", ctx.get("user"), "user")


def _named(doc: dict, section: str, name: str | None, field: str) -> dict:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get(field) or {}
    known = ", ".join(str(e.get("name")) for e in doc.get(section) or [] if isinstance(e, dict)) or "none"
    raise KubeError(f"the kubeconfig has no {field} named {name!r} (it has: {known})")


def _tls_context(cluster: dict, user: dict):
    import ssl

    ca = cluster.get("certificate-authority-data")
    if ca:
        context = ssl.create_default_context(cadata=_b64_text(ca, "certificate-authority-data"))
    else:
        context = ssl.create_default_context(cafile=cluster.get("certificate-authority"))
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert, key = user.get("client-certificate-data"), user.get("client-key-data")
    if cert and key:
        pem = (_b64_text(cert, "client-certificate-data") + "\n" + _b64_text(key, "client-key-data")).encode()
        _load_client_certificate(context, pem)
    elif user.get("client-certificate") and user.get("client-key"):
        context.load_cert_chain(user["client-certificate"], user["client-key"])  # the user's own files
    return context


def _b64_text(value: str, field: str) -> str:
    try:
        return base64.b64decode(value, validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        raise KubeError(f"the kubeconfig's {field} is not base64 PEM") from None


def _load_client_certificate(context, pem: bytes) -> None:
    """ssl only loads certificates from paths: give it one that never reaches a disk, or lives for a moment."""
    import ssl
    import tempfile

    try:
        if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
            fd = os.memfd_create("elastictrain-client-cert", getattr(os, "MFD_CLOEXEC", 0))
            try:
                os.write(fd, pem)
                context.load_cert_chain(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
            return
        with tempfile.TemporaryDirectory(prefix="elastictrain-") as folder:  # mode 0700
            path = os.path.join(folder, "client.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(pem)
            context.load_cert_chain(path)
    except ssl.SSLError:
        raise KubeError("the kubeconfig's client certificate and key do not load") from None


def _exec_credential_token(spec: dict) -> str:
    """Run the kubeconfig's credential plugin (kubelogin on Entra ID clusters) and take its token."""
    import subprocess

    command = str(spec.get("command") or "")
    env = dict(os.environ)
    env.update({e["name"]: e["value"] for e in spec.get("env") or [] if "name" in e and "value" in e})
    env["KUBERNETES_EXEC_INFO"] = json.dumps({
        "apiVersion": spec.get("apiVersion", "client.authentication.k8s.io/v1beta1"),
        "kind": "ExecCredential", "spec": {"interactive": False}})
    try:
        proc = subprocess.run([command, *(spec.get("args") or [])], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=_EXEC_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as ex:
        raise KubeError(f"cannot run the kubeconfig's credential plugin {command!r} ({type(ex).__name__}); "
                        "on Entra ID clusters install kubelogin (az aks install-cli)") from None
    if proc.returncode != 0:
        # stderr only: the credential, if any, is on stdout.
        detail = proc.stderr.decode(errors="replace").strip()[-300:]
        raise KubeError(f"the credential plugin {command!r} failed (exit {proc.returncode}): {detail}")
    try:
        token = json.loads(proc.stdout)["status"]["token"]
    except (ValueError, KeyError, TypeError):
        raise KubeError(f"the credential plugin {command!r} gave no token") from None
    return str(token)


class HttpKubeClient:
    """:class:`KubeClient` over the Kubernetes REST API."""

    def __init__(self, server: str, ssl_context=None, *, token: str | None = None,
                 secrets: list[str] | tuple[str, ...] = (), server_hostname: str | None = None) -> None:
        self._server = server.rstrip("/")
        self._headers = {"Accept": "application/json", "User-Agent": "az-elastictrain"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._secrets = tuple(s for s in [token, *secrets] if s)
        self._pool = _pool_manager(self._server, ssl_context, server_hostname)
        self._kinds: dict[str, dict[str, tuple[str, bool]]] = {}

    def __repr__(self) -> str:  # never the headers
        return f"HttpKubeClient({self._server!r})"

    def apply(self, obj: dict) -> dict:
        meta = obj.get("metadata") or {}
        what = _describe(obj.get("kind"), meta.get("name"), meta.get("namespace"))
        path = self._path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        if path is None:
            raise KubeError(f"cannot apply {what}: the cluster does not serve {obj['kind']} in "
                            f"{obj['apiVersion']} (is its CustomResourceDefinition installed?)", status=404)
        status, body = self._request("PATCH", path, {"fieldManager": FIELD_MANAGER, "force": "true"},
                                     json.dumps(obj).encode(), "application/apply-patch+yaml")
        self._check(f"apply {what}", status, body)
        return body

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        path = self._path(api_version, kind, namespace, name)
        if path is None:
            return None
        status, body = self._request("GET", path)
        if status == 404:
            return None
        self._check(f"get {_describe(kind, name, namespace)}", status, body)
        return body

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict]:
        path = self._path(api_version, kind, namespace, None)
        query = {"limit": str(_PAGE_SIZE), **({"labelSelector": label_selector} if label_selector else {})}
        items: list[dict] = []
        while path is not None:
            status, body = self._request("GET", path, query)
            if status == 404:
                return items
            self._check(f"list {kind}", status, body)
            items += [{"apiVersion": api_version, "kind": kind, **item} for item in body.get("items") or []]
            query["continue"] = (body.get("metadata") or {}).get("continue") or ""
            if not query["continue"]:
                break
        return items

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        path = self._path(api_version, kind, namespace, name)
        if path is None:
            return False
        status, body = self._request("DELETE", path, {"propagationPolicy": "Background"})
        if status == 404:
            return False
        self._check(f"delete {_describe(kind, name, namespace)}", status, body)
        return True

    def pod_logs(self, name: str, namespace: str, container: str | None = None, follow: bool = False,
                 tail: int | None = None) -> Iterator[str]:
        path = self._path("v1", "Pod", namespace, name)
        what = f"read the log of {_describe('Pod', name, namespace)}"
        if path is None:
            raise KubeError(f"cannot {what}: the cluster serves no pods", status=404)
        query = {**({"container": container} if container else {}), **({"follow": "true"} if follow else {}),
                 **({"tailLines": str(tail)} if tail is not None else {})}
        # Followed, a log may stay quiet for long (a slow step): no read timeout, the server ends the stream.
        response = self._open("GET", f"{path}/log", query, read_timeout=None if follow else _READ_TIMEOUT_S)
        if response.status >= 400:
            try:
                body = json.loads(response.data or b"{}")
            except ValueError:
                body = {}
            finally:
                response.release_conn()
            self._check(what, response.status, body)
        return _lines(response)

    def _path(self, api_version: str, kind: str, namespace: str | None, name: str | None) -> str | None:
        """The REST path of a kind (and object), or None where the cluster does not serve the kind."""
        found = self._discover(api_version).get(kind)
        if found is None:
            return None
        plural, namespaced = found
        path = _group_version_path(api_version)
        if namespaced and namespace:
            path += f"/namespaces/{quote(namespace, safe='')}"
        elif namespaced and name is not None:
            raise ValueError(f"{kind} {name!r} is namespaced: give its namespace")
        path += f"/{plural}"
        return path + (f"/{quote(name, safe='')}" if name is not None else "")

    def _discover(self, api_version: str) -> dict[str, tuple[str, bool]]:
        if api_version not in self._kinds:
            status, body = self._request("GET", _group_version_path(api_version))
            if status == 404:
                return {}  # not served (yet): asked again next time, a CRD may be on its way
            self._check(f"discover {api_version}", status, body)
            self._kinds[api_version] = {r["kind"]: (r["name"], bool(r.get("namespaced")))
                                        for r in body.get("resources") or [] if "/" not in r.get("name", "/")}
        return self._kinds[api_version]

    def _request(self, method: str, path: str, query: dict | None = None, body: bytes | None = None,
                 content_type: str | None = None) -> tuple[int, Any]:
        response = self._open(method, path, query, body, content_type)
        try:
            return response.status, json.loads(response.data or b"{}")
        except ValueError:
            return response.status, {}
        finally:
            response.release_conn()

    def _open(self, method: str, path: str, query: dict | None = None, body: bytes | None = None,
              content_type: str | None = None, *, read_timeout: float | None = _READ_TIMEOUT_S):
        """Send a request; the response's body is read as it is consumed (``.data`` reads it all)."""
        import urllib3

        url = self._server + path + (f"?{urlencode(query)}" if query else "")
        headers = dict(self._headers, **({"Content-Type": content_type} if content_type else {}))
        try:
            return self._pool.request(method, url, body=body, headers=headers, retries=_retries(),
                                      preload_content=False,
                                      timeout=urllib3.Timeout(connect=_CONNECT_TIMEOUT_S, read=read_timeout))
        except urllib3.exceptions.HTTPError as ex:
            reason = getattr(ex, "reason", None) or ex
            raise KubeError(self._redact(f"cannot reach the Kubernetes API server {self._server}: "
                                         f"{type(reason).__name__}: {reason}")) from None

    def _check(self, action: str, status: int, body: Any) -> None:
        if status < 400:
            return
        body = body if isinstance(body, dict) else {}
        reason, message = body.get("reason"), body.get("message") or "no details"
        raise KubeError(self._redact(f"{action} failed: HTTP {status}{f' {reason}' if reason else ''}: "
                                     f"{message}{_HINTS.get(status, '')}"), status=status, reason=reason)

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        return text


def _lines(response) -> Iterator[str]:
    """A streamed text body, line by line (a last line without its end included)."""
    import urllib3

    pending = b""
    try:
        for chunk in response.stream(8192, decode_content=True):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", errors="replace")
    except urllib3.exceptions.HTTPError as ex:
        raise KubeError(f"the log stream broke off: {type(ex).__name__}") from None
    finally:
        response.release_conn()
    if pending:
        yield pending.decode("utf-8", errors="replace")


def _group_version_path(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def _describe(kind: str | None, name: str | None, namespace: str | None) -> str:
    return f"{kind} {namespace + '/' if namespace else ''}{name}"


def _retries():
    import urllib3

    # Server-side apply, get and delete are idempotent: retry what a busy API server answers.
    return urllib3.Retry(total=3, connect=3, read=1, status=3, backoff_factor=0.25, raise_on_status=False,
                         status_forcelist=(429, 502, 503, 504), allowed_methods=("GET", "PATCH", "DELETE"))


def _pool_manager(server: str, ssl_context, server_hostname: str | None):
    import urllib3
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(server)
    options: dict[str, Any] = {"maxsize": 4}
    if parts.scheme == "https":
        options["ssl_context"] = ssl_context
        if server_hostname:
            options["server_hostname"] = server_hostname
    proxy = getproxies().get(parts.scheme)
    if proxy and not proxy_bypass(parts.hostname or ""):
        return urllib3.ProxyManager(proxy, **options)
    return urllib3.PoolManager(**options)
