"""The fake Kubernetes (tests/support/fake_kube.py) as an API server on loopback, for the real client.

It speaks the REST shapes the official client uses - discovery (``/version``, ``/api``, ``/apis``, ``/api/v1``,
``/apis/<group>/<version>``: the kinds the cluster serves, a custom kind once its CRD is there), server-side apply
(PATCH ``application/apply-patch+yaml`` with a ``fieldManager``; the body must name the object of the URL), get,
list (label selector, ``limit``/``continue`` paging), delete, watch (one object, until ``timeoutSeconds``), pod
logs (``container``, ``tailLines``, ``timestamps``), and ``Status`` bodies for errors, with the fake's strictness
(422 Invalid, 409 Conflict) - over HTTP, or HTTPS with a throw-away CA that can also take a client certificate.
:func:`answer` is the API itself, which tests/support/arm_server/aks.py serves as each AKS cluster's API server too.
Started and stopped by a context manager; every request is recorded.

Authentication, as an API server: a static ``token`` (or a client certificate of its CA), or with ``entra=True``
as an AKS Entra ID-only API server: only a bearer JWT whose audience is the AKS server application and which has
not expired (``expire_after_uses`` ends each token after that many requests); a client certificate, a missing
token or another audience is a 401.

    with serve_kube_api(token="t0k3n") as api:
        client = connect(api.kubeconfig())
        api.kube.seed(...)  # the cluster behind it: a FakeKube
"""
from __future__ import annotations

import base64
import contextlib
import datetime
import json
import re
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

from requests.structures import CaseInsensitiveDict

from azext_elastictrain.clients.kube import KubeError
from tests.support.fake_kube import CLUSTER_SCOPED, VERSION, FakeKube


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
    """The running server: its URL, the cluster behind it (``kube``), what it was asked, and how to make it fail."""

    url: str
    token: str | None
    ca_pem: bytes | None = None
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    kube: FakeKube = field(default_factory=FakeKube)
    requests: list = field(default_factory=list)
    failures: dict = field(default_factory=dict)  # (method, path) -> (status, Status body)
    page_size_cap: int | None = None  # answer lists in pages of at most this many items
    entra: bool = False  # an AKS Entra ID-only API server: Entra ID tokens for the AKS server application only
    expire_after_uses: int | None = None  # Entra ID: each token is refused after this many requests
    log_stall: float = 0.0  # a followed log: seconds of silence after the stored text, then the stream ends
    _uses: dict = field(default_factory=dict)

    def fail(self, method: str, path: str, status: int, reason: str, message: str) -> None:
        self.failures[(method, path)] = (status, _status(status, reason, message))

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
            status, body = answer(api.kube, self.command, parts.path, {k: v[0] for k, v in request.query.items()},
                                  request.body, page_size_cap=api.page_size_cap)
            request.status = status
            if not isinstance(body, (dict, bytes)):  # a watch: its events as they come
                return self._stream(body)
            stall = api.log_stall  # as it is when the request comes: a test may change it for the next one
            if isinstance(body, bytes) and request.query.get("follow") == ["true"] and stall:
                return self._stalled_log(body, stall)
            return self._answer(status, body)

        def _stream(self, events: Iterator[bytes]) -> None:
            self.send_response(200)  # HTTP/1.0: the body is what comes until the connection closes
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            for line in events:
                self.wfile.write(line)
                self.wfile.flush()

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


# -- the API ------------------------------------------------------------------------------------------------------

_PATH = re.compile(r"/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                   r"(?:/namespaces/(?P<ns>[^/]+))?(?:/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?)?")
_LOG_PATH = re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log")


def answer(kube: FakeKube, method: str, path: str, query: dict[str, str], body: bytes, *,
           page_size_cap: int | None = None, watch_timeout: float | None = None) -> tuple[int, Any]:
    """One request to the API server of ``kube``: (status, a JSON body, the bytes of a log, or - a watch - an
    iterator of event lines). ``watch_timeout`` caps how long a watch lasts (0: the object as it is, then the
    end, as an API server may end a watch at any time)."""
    if method == "GET" and path in ("/version", "/api", "/apis"):
        return 200, _discovery_root(kube, path)
    log = _LOG_PATH.fullmatch(path)
    if log and method == "GET":
        return _log(kube, log["ns"], log["name"], query)
    m = _PATH.fullmatch(path)
    if not m:
        return 404, _status(404, "NotFound", "the server could not find the requested resource")
    api_version = "v1" if m["core"] else f"{m['group']}/{m['version']}"
    plural, name, namespace = m["plural"], m["name"], m["ns"]
    if namespace and plural is None:  # /api/v1/namespaces/NAME: the Namespace itself
        plural, name, namespace = "namespaces", namespace, None
    if plural is None:
        if method != "GET":
            return 405, _status(405, "MethodNotAllowed", f"{method} is not allowed on {path}")
        if not kube.kinds(api_version):
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        return 200, _discovery(kube, api_version)
    kind = next((k for k in kube.kinds(api_version) if plural_of(k) == plural), None)
    if kind is None:
        return 404, _status(404, "NotFound", "the server could not find the requested resource")
    try:
        if method == "PATCH":
            return _apply(kube, api_version, kind, name, namespace, query, body)
        if method == "GET" and query.get("watch") in ("true", "True", "1"):
            wanted = query.get("fieldSelector", "").partition("metadata.name=")[2]
            timeout = float(query.get("timeoutSeconds") or 5)
            events = kube.watch(api_version, kind, wanted, namespace,
                                timeout if watch_timeout is None else min(timeout, watch_timeout))
            return 200, (json.dumps({"type": kind_, "object": obj}).encode() + b"\n" for kind_, obj in events)
        if method == "GET" and name:
            found = kube.get(api_version, kind, name, namespace)
            return (200, found) if found else (404, _status(404, "NotFound", f'{plural} "{name}" not found'))
        if method == "GET":
            return 200, _list(kube, api_version, kind, namespace, query, page_size_cap)
        if method == "DELETE" and name:
            if kube.delete(api_version, kind, name, namespace):
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
            return 404, _status(404, "NotFound", f'{plural} "{name}" not found')
    except KubeError as ex:  # the API server's Status body (details: what a 422 Invalid names)
        return ex.status or 500, {**_status(ex.status or 500, ex.reason or "InternalError", str(ex)),
                                  **({"details": ex.details} if getattr(ex, "details", None) else {})}
    return 405, _status(405, "MethodNotAllowed", f"{method} is not allowed on {path}")


def _apply(kube: FakeKube, api_version: str, kind: str, name: str | None, namespace: str | None,
           query: dict[str, str], body: bytes) -> tuple[int, Any]:
    """Server-side apply: the object of the URL, by a named field manager."""
    try:
        obj = json.loads(body)
    except ValueError:
        return 400, _status(400, "BadRequest", "the body of the request is not JSON or YAML")
    meta = obj.get("metadata") or {}
    if not query.get("fieldManager"):
        return 422, _status(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required "
                                            "value: is required for apply patch")
    if (obj.get("apiVersion"), obj.get("kind")) != (api_version, kind) or meta.get("name") != name or \
            (meta.get("namespace") or namespace) != namespace:
        return 400, _status(400, "BadRequest", f"the object {obj.get('kind')} {meta.get('namespace')}/"
                                               f"{meta.get('name')} does not match the URL ({kind} {namespace}/{name})")
    existed = kube.get(api_version, kind, name, namespace) is not None
    applied = kube.apply(obj, field_manager=query["fieldManager"], force=query.get("force") == "true")
    return (200 if existed else 201), applied


def _list(kube: FakeKube, api_version: str, kind: str, namespace: str | None, query: dict[str, str],
          page_size_cap: int | None) -> dict:
    items = kube.list(api_version, kind, namespace, query.get("labelSelector"))
    start = int(query.get("continue") or 0)
    size = min(int(query.get("limit") or 500), page_size_cap or 10**9)
    page, more = items[start:start + size], start + size < len(items)
    return {"kind": f"{kind}List", "apiVersion": api_version, "items": page,
            "metadata": {"resourceVersion": str(kube.resource_version()),
                         **({"continue": str(start + size)} if more else {})}}


def _log(kube: FakeKube, namespace: str, pod: str, query: dict[str, str]) -> tuple[int, Any]:
    """GET .../pods/<pod>/log: the stored text (of ``container``), its last ``tailLines`` lines, each with its
    RFC 3339 timestamp (nanoseconds, as the kubelet writes them; 3 lines a second) when asked."""
    tail = query.get("tailLines")
    try:
        lines = list(kube.pod_logs(pod, namespace, query.get("container"), query.get("follow") == "true",
                                   None))
    except KubeError as ex:
        return ex.status or 500, _status(ex.status or 500, ex.reason or "InternalError", str(ex))
    stamps = [f"2026-01-01T00:00:{i // 3:02d}.{i % 3:09d}Z " for i in range(len(lines))]
    if tail is not None:
        lines, stamps = lines[max(0, len(lines) - int(tail)):], stamps[max(0, len(stamps) - int(tail)):]
    if query.get("timestamps") == "true":
        lines = [stamp + line for stamp, line in zip(stamps, lines)]
    return 200, "".join(line + "\n" for line in lines).encode()


def _discovery_root(kube: FakeKube, path: str) -> dict:
    """GET /version, /api and /apis: what API discovery asks first."""
    if path == "/version":
        major, minor, _ = VERSION.split(".")
        return {"major": major, "minor": minor, "gitVersion": f"v{VERSION}", "platform": "linux/amd64"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    groups: dict[str, list[dict]] = {}
    for group_version in kube.group_versions():
        if "/" in group_version:
            group, version = group_version.split("/")
            groups.setdefault(group, []).append({"groupVersion": group_version, "version": version})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": name, "versions": versions, "preferredVersion": versions[0]} for name, versions in groups.items()]}


def _discovery(kube: FakeKube, api_version: str) -> dict:
    resources = [{"name": plural_of(k), "singularName": k.lower(), "kind": k, "namespaced": k not in CLUSTER_SCOPED,
                  "verbs": ["create", "delete", "get", "list", "patch", "watch"]} for k in kube.kinds(api_version)]
    resources += [{"name": f"{r['name']}/status", "kind": r["kind"], "namespaced": r["namespaced"],
                   "verbs": ["get", "patch"]} for r in list(resources)]
    return {"kind": "APIResourceList", "groupVersion": api_version, "resources": resources}


def plural_of(kind: str) -> str:
    lower = kind.lower()
    return lower[:-1] + "ies" if lower.endswith("y") else lower + ("es" if lower.endswith("s") else "s")


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


@contextlib.contextmanager
def serve_kube_api(token: str | None = "test-token", *, tls_dir: Path | None = None, entra: bool = False,
                   kube: FakeKube | None = None) -> Iterator[KubeApi]:
    """Serve ``kube`` (a new, empty FakeKube by default) on a free loopback port (HTTPS when ``tls_dir`` is given:
    certificates are written there)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server.daemon_threads = True
    scheme = "https" if tls_dir else "http"
    api = KubeApi(url=f"{scheme}://127.0.0.1:{server.server_address[1]}", token=token, entra=entra,
                  kube=kube if kube is not None else FakeKube())
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
