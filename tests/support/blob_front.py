"""The blob endpoint of the contract tests' storage accounts: Azure storage's authorization in front of a real Azurite.

Azurite's OAuth check (``--oauth basic``) admits any unexpired token for storage; Azure storage also asks Azure RBAC
whether the token's principal holds a data role on the container. A login that is Owner of the subscription but has
no ``Storage Blob Data *`` role gets 403 ``AuthorizationPermissionMismatch`` (learn.microsoft.com "Assign an Azure
role for access to blob data": Owner and Contributor have no data actions). This front does that check against the
role assignments the ARM test server holds, then passes the request to Azurite unchanged.

Each account is served under its own name: ``https://127.0.0.1:PORT/<account>/<container>/<blob>`` (the ARM server
answers that as the account's ``primaryEndpoints.blob``), forwarded to Azurite's one account. Reads (GET, HEAD) need
any data role, writes (PUT, POST, DELETE) Contributor or Owner. Requests without a bearer token (a key) are the
runtime's side and go straight to Azurite, not through here. Listens on 127.0.0.1; ``close()`` stops it.
"""
from __future__ import annotations

import http.client
import ssl
import threading
import uuid
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests.support.arm_server import BLOB_DATA_CONTRIBUTOR, BLOB_DATA_OWNER, ArmServer, _claims

#: Azure storage's answer to a principal without the data action asked (status 403, x-ms-error-code header).
DENIED = "AuthorizationPermissionMismatch"
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class BlobFront:
    """See the module docstring. ``denied`` records (method, path, principal) of each request refused."""

    def __init__(self, arm: ArmServer, azurite_endpoint: str) -> None:
        self.arm = arm
        parts = urlsplit(azurite_endpoint)  # https://127.0.0.1:PORT/devstoreaccount1
        self._target = (parts.hostname, parts.port, parts.path.strip("/"))
        self._client_tls = ssl.create_default_context(cafile=str(arm.cert))
        self.denied: list[tuple[str, str, str | None]] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_tls.load_cert_chain(arm.cert, arm.key)
        self._httpd.socket = server_tls.wrap_socket(self._httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="blob-front", daemon=True)
        self._thread.start()

    @property
    def endpoint_template(self) -> str:
        """What the ARM server answers as ``primaryEndpoints.blob`` (``{account}``: each account's name)."""
        return self.url + "/{account}/"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def allowed(self, method: str, principal: str | None, account: str, container: str) -> bool:
        if not principal:
            return False
        roles = self.arm.data_roles(principal, account, container)
        if method in ("GET", "HEAD"):
            return bool(roles)
        return bool(roles & {BLOB_DATA_CONTRIBUTOR, BLOB_DATA_OWNER})

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, list, bytes]:
        host, port, account = self._target
        connection = http.client.HTTPSConnection(host, port, context=self._client_tls, timeout=60)
        try:
            connection.request(method, path.replace("/", f"/{account}/", 1) if path.startswith("/") else path,
                               body=body or None, headers={k: v for k, v in headers.items()
                                                           if k.lower() not in _HOP_BY_HOP})
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()


def _denied_body() -> bytes:
    now = formatdate(usegmt=True)
    return ('<?xml version="1.0" encoding="utf-8"?><Error><Code>AuthorizationPermissionMismatch</Code><Message>This '
            "request is not authorized to perform this operation using this permission.\n"
            f"RequestId:{uuid.uuid4()}\nTime:{now}</Message></Error>").encode()


def _handler(front: BlobFront):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            segments = parts.path.lstrip("/").split("/")
            account, container = segments[0], segments[1] if len(segments) > 1 else ""
            bearer = self.headers.get("Authorization", "")
            principal = _claims(bearer[len("Bearer "):]).get("oid") if bearer.startswith("Bearer ") else None
            if not front.allowed(self.command, principal, account, container):
                front.denied.append((self.command, self.path, principal))
                data = _denied_body()
                self.send_response(403, "This request is not authorized to perform this operation using this "
                                        "permission.")
                self.send_header("Content-Type", "application/xml")
                self.send_header("x-ms-error-code", DENIED)
                self.send_header("x-ms-request-id", str(uuid.uuid4()))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            rest = "/" + "/".join(segments[1:]) + (f"?{parts.query}" if parts.query else "")
            status, headers, data = front.forward(self.command, rest, dict(self.headers.items()), body)
            self.send_response(status)
            for key, value in headers:
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            size = next((v for k, v in headers if k.lower() == "content-length"), None) \
                if self.command == "HEAD" else None  # a HEAD tells the blob's size, and sends none of it
            self.send_header("Content-Length", size or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

        def log_message(self, *args) -> None:
            pass

    return Handler
