"""A tiny Kubernetes API server on loopback, for testing ``clients.kube``'s real client.

It speaks the REST shapes the official client uses — discovery (``/version``, ``/api``, ``/apis``, ``/api/v1``,
``/apis/<group>/<version>``), server-side apply (PATCH ``application/apply-patch+yaml``; a field another manager
owns is a 409 conflict unless ``force``, as the API server does), get, list (label selector,
``limit``/``continue`` paging), delete, watch (one object, until ``timeoutSeconds``), pod logs (``tailLines``,
``timestamps``), and ``Status`` bodies for errors — over HTTP, or HTTPS with a throw-away CA that can also
take a client certificate. Started and stopped by a context manager; every request is recorded.

Authentication, as an API server: a static ``token`` (or a client certificate of its CA), or with ``entra=True``
as an AKS Entra ID-only API server: only a bearer JWT whose audience is the AKS server application and which has
not expired (``expire_after_uses`` ends each token after that many requests); a client certificate, a missing
token or another audience is a 401.

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

from requests.structures import CaseInsensitiveDict

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
    status: int | None = None


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
    entra: bool = False  # an AKS Entra ID-only API server: Entra ID tokens for the AKS server application only
    expire_after_uses: int | None = None  # Entra ID: each token is refused after this many requests
    owners: dict = field(default_factory=dict)  # path -> {field: manager}: fields another manager owns
    log_stall: float = 0.0  # a followed log: seconds of silence after the stored text, then the stream ends
    _uses: dict = field(default_factory=dict)
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
            request = Request(self.command, parts.path, parse_qs(parts.query), CaseInsensitiveDict(self.headers.items()),
                              body, subject)
            api.requests.append(request)
            if not _authenticated(api, self.headers.get("Authorization") or "", subject):
                request.status = 401
                return self._answer(401, _status(401, "Unauthorized", "Unauthorized"))
            if (self.command, parts.path) in api.failures:
                request.status = api.failures[(self.command, parts.path)][0]
                return self._answer(*api.failures[(self.command, parts.path)])
            if request.query.get("watch") in (["true"], ["True"], ["1"]):
                request.status = 200
                return self._watch(request)
            status, body = _route(api, request)
            request.status = status
            stall = api.log_stall  # as it is when the request comes: a test may change it for the next one
            if isinstance(body, bytes) and request.query.get("follow") == ["true"] and stall:
                return self._stalled_log(body, stall)
            return self._answer(status, body)

        def _watch(self, request: Request) -> None:
            """A watch of one object (fieldSelector metadata.name=...): ADDED as it is, then MODIFIED when its
            resourceVersion changes, DELETED when it goes, until timeoutSeconds."""
            import time

            name = (request.query.get("fieldSelector") or [""])[0].partition("metadata.name=")[2]
            path = request.path.rstrip("/") + "/" + name
            deadline = time.monotonic() + float((request.query.get("timeoutSeconds") or ["5"])[0])
            self.send_response(200)  # HTTP/1.0: the body is what comes until the connection closes
            self.send_header("Content-Type", "application/json")
            self.end_headers()

            def send(kind: str, obj: dict) -> None:
                self.wfile.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
                self.wfile.flush()

            seen = api.objects.get(path)
            if seen is not None:
                send("ADDED", seen)
            while time.monotonic() < deadline:
                time.sleep(0.02)
                now = api.objects.get(path)
                if now is None and seen is not None:
                    send("DELETED", seen)
                elif now is not None and (seen is None or now["metadata"]["resourceVersion"] !=
                                          seen["metadata"]["resourceVersion"]):
                    send("ADDED" if seen is None else "MODIFIED", now)
                seen = now

        def _stalled_log(self, body: bytes, stall: float) -> None:
            """The stored log, then silence for ``log_stall`` seconds (a connection gone quiet), then the end."""
            import time

            self.send_response(200)  # HTTP/1.0: the body is what comes until the connection closes
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            time.sleep(stall)

        do_GET = do_PATCH = do_DELETE = _handle

    return Handler


AKS_SERVER_APP = "6dae42f8-4368-4678-94ff-3960e28e3630"


def entra_token(audience: str = AKS_SERVER_APP, *, lifetime: float = 3600, oid: str = "11111111-2222-3333-4444-"
                "555555555555") -> str:
    """An Entra ID-shaped access token (a JWT; the signature is not checked here) with a unique ``jti``."""
    import time
    import uuid

    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    now = int(time.time())
    claims = {"aud": audience, "iss": "https://sts.windows.net/tenant/", "iat": now, "nbf": now,
              "exp": now + int(lifetime), "oid": oid, "jti": str(uuid.uuid4())}
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def token_claims(token: str) -> dict:
    try:
        part = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (IndexError, ValueError):
        return {}


def _authenticated(api: KubeApi, authorization: str, subject: str | None) -> bool:
    import time

    token = authorization[len("Bearer "):] if authorization.startswith("Bearer ") else None
    if api.entra:  # client certificates are not accepted: local accounts are off
        claims = token_claims(token) if token else {}
        api._uses[claims.get("jti")] = uses = api._uses.get(claims.get("jti"), 0) + 1
        return (claims.get("aud") in (AKS_SERVER_APP, f"spn:{AKS_SERVER_APP}") and claims.get("exp", 0) > time.time()
                and (api.expire_after_uses is None or uses <= api.expire_after_uses))
    return not api.token or token == api.token or bool(subject)


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
    if request.path == "/version":
        return 200, {"major": "1", "minor": "33", "gitVersion": "v1.33.2"}
    if request.path == "/api":
        return 200, {"kind": "APIVersions", "versions": ["v1"]}
    if request.path == "/apis":
        groups = sorted({gv for gv, _, _ in RESOURCES.values() if "/" in gv})
        return 200, {"kind": "APIGroupList", "groups": [
            {"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
             "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}} for gv in groups]}
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
    stamps = [f"2026-01-01T00:00:{i // 3:02d}.{i % 3:09d}Z " for i in range(len(lines))]  # 3 lines a second
    if request.query.get("tailLines"):
        count = int(request.query["tailLines"][0])
        lines, stamps = lines[max(0, len(lines) - count):], stamps[max(0, len(stamps) - count):]
    if request.query.get("timestamps") == ["true"]:
        lines = [stamp + line for stamp, line in zip(stamps, lines)]
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
    owned = api.owners.get(request.path) or {}
    taken = [f for f, manager in owned.items() if manager != (request.query.get("fieldManager") or [""])[0]
             and _field(applied, f) is not None and _field(applied, f) != _field(current or {}, f)]
    if taken and request.query.get("force") != ["true"]:
        return 409, _status(409, "Conflict", f"Apply failed with {len(taken)} conflict: " + "; ".join(
            f'conflict with "{owned[f]}": .{f}' for f in taken))
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


def _field(obj: dict, dotted: str):
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


@contextlib.contextmanager
def serve_kube_api(token: str | None = "test-token", *, tls_dir: Path | None = None,
                   entra: bool = False) -> Iterator[KubeApi]:
    """Serve on a free loopback port (HTTPS when ``tls_dir`` is given: certificates are written there)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server.daemon_threads = True
    scheme = "https" if tls_dir else "http"
    api = KubeApi(url=f"{scheme}://127.0.0.1:{server.server_address[1]}", token=token, entra=entra)
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
    ca_key, ca_cert = certificate("test-ca", None, None, ca=True)
    server_key, server_cert = certificate("127.0.0.1", ca_key, ca_cert, ip="127.0.0.1")
    client_key, client_cert = certificate("test-user", ca_key, ca_cert)
    api.ca_pem, api.client_cert_pem, api.client_key_pem = pem(ca_cert), pem(client_cert), pem(client_key)
    (folder / "server.pem").write_bytes(pem(server_cert) + pem(server_key))
    (folder / "ca.pem").write_bytes(api.ca_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem")
    context.load_verify_locations(folder / "ca.pem")
    context.verify_mode = ssl.CERT_OPTIONAL  # token or client certificate
    server.socket = context.wrap_socket(server.socket, server_side=True)


def certificate(name: str, issuer_key, issuer_cert, *, ca: bool = False, ip: str | None = None):
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


def pem(item) -> bytes:
    from cryptography.hazmat.primitives import serialization

    if hasattr(item, "private_bytes"):
        return item.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    return item.public_bytes(serialization.Encoding.PEM)
