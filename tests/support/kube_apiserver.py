"""A tiny Kubernetes API server on loopback, for testing ``clients.kube``'s real client.

It speaks the REST shapes the client uses — discovery (``/api/v1``, ``/apis/<group>/<version>``), server-side
apply (PATCH ``application/apply-patch+yaml``), get, list (label selector, ``limit``/``continue`` paging),
delete, and ``Status`` bodies for errors — over HTTP, or HTTPS with a throw-away CA that can also require a
client certificate. Started and stopped by a context manager; every request is recorded.

    with serve_kube_api(token="t0k3n") as api:
        client = connect(api.kubeconfig())
"""
from __future__ import annotations

import base64
import contextlib
import datetime
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, urlsplit

# kind -> (apiVersion, plural, namespaced): what discovery answers.
RESOURCES = {
    "Namespace": ("v1", "namespaces", False),
    "ConfigMap": ("v1", "configmaps", True),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "Service": ("v1", "services", True),
    "Pod": ("v1", "pods", True),
    "Node": ("v1", "nodes", False),
    "StatefulSet": ("apps/v1", "statefulsets", True),
    "Deployment": ("apps/v1", "deployments", True),
    "DaemonSet": ("apps/v1", "daemonsets", True),
    "CustomResourceDefinition": ("apiextensions.k8s.io/v1", "customresourcedefinitions", False),
}


@dataclass
class Request:
    method: str
    path: str
    query: dict
    headers: dict
    body: bytes
    client_cert_subject: str | None = None


@dataclass
class KubeApi:
    """The running server: its URL, what it holds, what it was asked, and how to make it fail."""

    url: str
    token: str | None
    ca_pem: bytes | None = None
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    objects: dict = field(default_factory=dict)  # path -> object
    requests: list = field(default_factory=list)
    failures: dict = field(default_factory=dict)  # (method, path) -> (status, Status body)
    page_size_cap: int | None = None  # answer lists in pages of at most this many items
    logs: dict = field(default_factory=dict)  # (namespace, pod, container or None) -> log text
    _version: int = 0

    def fail(self, method: str, path: str, status: int, reason: str, message: str) -> None:
        self.failures[(method, path)] = (status, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                  "reason": reason, "message": message, "code": status})

    def kubeconfig(self, *, token: str | None = None, use_token: bool = True, client_cert: bool = False) -> bytes:
        """A kubeconfig for this server: its token (or ``token``), and/or a client certificate."""
        cluster = {"server": self.url}
        if self.ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(self.ca_pem).decode()
        user: dict = {}
        if use_token and (token or self.token):
            user["token"] = token or self.token
        if client_cert:
            user["client-certificate-data"] = base64.b64encode(self.client_cert_pem).decode()
            user["client-key-data"] = base64.b64encode(self.client_key_pem).decode()
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
               "clusters": [{"name": "test", "cluster": cluster}],
               "users": [{"name": "test-user", "user": user}],
               "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test-user"}}]}
        return json.dumps(doc).encode()  # JSON is YAML

    def next_version(self) -> str:
        self._version += 1
        return str(self._version)


def _handler(api: KubeApi):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _answer(self, status: int, body: dict | bytes) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(body, bytes) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            cert = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
            subject = dict(x[0] for x in cert["subject"]).get("commonName") if cert else None
            request = Request(self.command, parts.path, parse_qs(parts.query), dict(self.headers), body, subject)
            api.requests.append(request)
            if api.token and self.headers.get("Authorization") != f"Bearer {api.token}" and not subject:
                return self._answer(401, _status(401, "Unauthorized", "Unauthorized"))
            if (self.command, parts.path) in api.failures:
                return self._answer(*api.failures[(self.command, parts.path)])
            return self._answer(*_route(api, request))

        do_GET = do_PATCH = do_DELETE = _handle

    return Handler


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message,
            "code": code}


def _discovery(group_version: str) -> dict | None:
    resources = [{"name": plural, "kind": kind, "namespaced": namespaced, "verbs": ["get", "list", "patch"]}
                 for kind, (gv, plural, namespaced) in RESOURCES.items() if gv == group_version]
    resources += [{"name": f"{r['name']}/status", "kind": r["kind"], "namespaced": r["namespaced"]}
                  for r in list(resources)]
    return {"kind": "APIResourceList", "groupVersion": group_version, "resources": resources} if resources else None


def _route(api: KubeApi, request: Request) -> tuple[int, dict]:
    segments = request.path.strip("/").split("/")
    group_version = "v1" if segments[0] == "api" else "/".join(segments[1:3])
    rest = segments[2:] if segments[0] == "api" else segments[3:]
    if request.method == "GET" and len(rest) == 5 and rest[2] == "pods" and rest[4] == "log":
        return _log(api, request, rest[1], rest[3])
    if not rest:
        found = _discovery(group_version)
        return (200, found) if found else (404, _status(404, "NotFound", "the server could not find it"))
    if request.method == "GET" and len(rest) in (1, 3):  # <plural> or namespaces/<ns>/<plural>
        return _list(api, request, group_version, rest)
    return _one(api, request)


def _log(api: KubeApi, request: Request, namespace: str, pod: str) -> tuple[int, dict | bytes]:
    """GET .../pods/<pod>/log: the stored text (of ``container``), its last ``tailLines`` lines."""
    container = (request.query.get("container") or [None])[0]
    text = api.logs.get((namespace, pod, container))
    if text is None:
        text = api.logs.get((namespace, pod, None))
    if text is None:
        return 404, _status(404, "NotFound", f'pods "{pod}" not found')
    lines = text.splitlines(keepends=True)
    if request.query.get("tailLines"):
        count = int(request.query["tailLines"][0])
        lines = lines[max(0, len(lines) - count):]
    return 200, "".join(lines).encode()


def _list(api: KubeApi, request: Request, group_version: str, rest: list[str]) -> tuple[int, dict]:
    prefix = request.path.rstrip("/") + "/"
    items = [o for p, o in sorted(api.objects.items()) if p.startswith(prefix) and p.count("/") == prefix.count("/")]
    if len(rest) == 1 and not items:  # a namespaced kind in all namespaces: every namespaces/*/<plural>/*
        base = request.path[: -len(rest[0])]
        items = [o for p, o in sorted(api.objects.items())
                 if p.startswith(base + "namespaces/") and p.split("/")[-2] == rest[0]]
    selector = (request.query.get("labelSelector") or [""])[0]
    items = [o for o in items if all((o["metadata"].get("labels") or {}).get(k) == v
                                     for k, v in (t.split("=", 1) for t in selector.split(",") if t))]
    start = int((request.query.get("continue") or ["0"])[0] or 0)
    size = min(int((request.query.get("limit") or ["500"])[0]), api.page_size_cap or 10**9)
    page, more = items[start:start + size], start + size < len(items)
    return 200, {"kind": "List", "apiVersion": group_version, "items": page,
                 "metadata": {"resourceVersion": str(api._version), **({"continue": str(start + size)} if more else {})}}


def _one(api: KubeApi, request: Request) -> tuple[int, dict]:
    current = api.objects.get(request.path)
    name = request.path.rsplit("/", 1)[-1]
    if request.method == "GET":
        return (200, current) if current else (404, _status(404, "NotFound", f'"{name}" not found'))
    if request.method == "DELETE":
        if not current:
            return 404, _status(404, "NotFound", f'"{name}" not found')
        del api.objects[request.path]
        return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
    applied = json.loads(request.body)
    if current is None:
        applied["metadata"].update(resourceVersion=api.next_version(), uid=f"uid-{name}")
        api.objects[request.path] = applied
        return 201, applied
    changed = {**current, **applied, "metadata": {**current["metadata"], **applied["metadata"]}}
    changed["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    if changed != current:
        changed["metadata"]["resourceVersion"] = api.next_version()
        api.objects[request.path] = changed
    return 200, api.objects[request.path]


@contextlib.contextmanager
def serve_kube_api(token: str | None = "test-token", *, tls_dir: Path | None = None) -> Iterator[KubeApi]:
    """Serve on a free loopback port (HTTPS when ``tls_dir`` is given: certificates are written there)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    scheme = "https" if tls_dir else "http"
    api = KubeApi(url=f"{scheme}://127.0.0.1:{server.server_address[1]}", token=token)
    server.RequestHandlerClass = _handler(api)
    if tls_dir:
        _serve_tls(server, api, tls_dir)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _serve_tls(server: ThreadingHTTPServer, api: KubeApi, folder: Path) -> None:
    ca_key, ca_cert = _certificate("test-ca", None, None, ca=True)
    server_key, server_cert = _certificate("127.0.0.1", ca_key, ca_cert, ip="127.0.0.1")
    client_key, client_cert = _certificate("test-user", ca_key, ca_cert)
    api.ca_pem, api.client_cert_pem, api.client_key_pem = _pem(ca_cert), _pem(client_cert), _pem(client_key)
    (folder / "server.pem").write_bytes(_pem(server_cert) + _pem(server_key))
    (folder / "ca.pem").write_bytes(api.ca_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem")
    context.load_verify_locations(folder / "ca.pem")
    context.verify_mode = ssl.CERT_OPTIONAL  # token or client certificate
    server.socket = context.wrap_socket(server.socket, server_side=True)


def _certificate(name: str, issuer_key, issuer_cert, *, ca: bool = False, ip: str | None = None):
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer_cert.subject if issuer_cert else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                        critical=False)
    if ip:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                                        critical=False)
    return key, builder.sign(issuer_key or key, hashes.SHA256())


def _pem(item) -> bytes:
    from cryptography.hazmat.primitives import serialization

    if hasattr(item, "private_bytes"):
        return item.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    return item.public_bytes(serialization.Encoding.PEM)
