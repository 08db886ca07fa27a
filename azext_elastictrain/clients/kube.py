"""The one module that talks to the Kubernetes API; everything above it sees only :class:`KubeClient`.

Built on the official ``kubernetes`` client (imported here, lazily: loading the extension never imports it): its
``DynamicClient`` finds each kind's path by API discovery and does server-side apply, get, list, delete and watch;
``CoreV1Api`` streams pod logs.

``connect(kubeconfig, credential=...)`` takes the kubeconfig az got from the cluster (``listClusterUserCredential``)
as bytes and keeps everything in memory:

* **Entra ID clusters** (local accounts off; the kubeconfig's user is a ``kubelogin`` exec plugin): only the
  cluster's server and CA are read. The bearer token comes from the command's credential - the az login, so users,
  service principals and managed identities alike - for the AKS server application (:data:`AKS_SCOPE`). It is asked
  again shortly before it expires, and once more when the API server answers 401 (a token it no longer accepts);
  a second 401 is an error. No plugin runs.
* **Local-account clusters**: the client certificate and key go to the TLS layer through anonymous in-memory files
  (Linux ``memfd``) held open while the client lives, else a private temporary folder removed at ``close()``.

Applies are server-side with the field manager ``elastictrain`` and without ``force``: a field another manager
owns (someone's ``kubectl edit``) is a conflict the user sees, never silently taken over.

Errors are :class:`KubeError` with the HTTP status; their messages never carry a token, key or certificate.
"""
from __future__ import annotations

import base64
import json
import os
import time
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")
FIELD_MANAGER = "elastictrain"
#: The Entra ID application of every AKS API server (AKS-managed Entra ID): the audience of the tokens it takes.
AKS_SERVER_APP = "6dae42f8-4368-4678-94ff-3960e28e3630"
AKS_SCOPE = f"{AKS_SERVER_APP}/.default"
_CONNECT_TIMEOUT_S = 10.0
_READ_TIMEOUT_S = 60.0
#: A followed log may be quiet for long (a slow step, a checkpoint upload); after this long without a byte the
#: stream is opened again from the last line seen, so a connection that died silently does not hang the command.
FOLLOW_READ_TIMEOUT_S = 300.0
_PAGE_SIZE = 500
#: Ask for a new token this long before the one held expires (azure-core's policies use the same margin).
_TOKEN_REFRESH_MARGIN_S = 300
_HINTS = {
    401: " (the cluster refused the credentials; they may have expired: fetch them again)",
    403: " (the signed-in identity lacks Kubernetes RBAC rights for this; on Entra ID clusters it needs e.g. "
         "the 'Azure Kubernetes Service RBAC Cluster Admin' role)",
    409: " (another field manager owns fields this sets, or someone changed it at the same time; nothing was "
         "changed: see who with 'kubectl get -o yaml --show-managed-fields', undo their change, and run again)",
    422: " (the API server rejected the object as invalid)",
}


class KubeError(RuntimeError):
    """A Kubernetes API call that failed: ``status`` is the HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class TokenSource:
    """A bearer token for the AKS server application from an azure-core ``TokenCredential``, held in memory.

    ``current()`` asks the credential again when the token is within five minutes of its expiry; ``renew()`` (after
    a 401) asks it for a new one - where the credential offers ``renew()`` (the CLI's login does) it is told first,
    so a cached token is not handed back - and says whether the token changed."""

    def __init__(self, credential: Any, scope: str = AKS_SCOPE, clock: Callable[[], float] = time.time) -> None:
        self._credential, self._scope, self._clock = credential, scope, clock
        self._token: str | None = None
        self._expires_on = 0.0

    def current(self) -> str:
        if self._token is None or self._expires_on - _TOKEN_REFRESH_MARGIN_S <= self._clock():
            self._fetch()
        return self._token or ""

    def renew(self) -> bool:
        old = self._token
        renew = getattr(self._credential, "renew", None)
        if callable(renew):
            renew()
        self._fetch()
        return self._token != old

    def secrets(self) -> list[str]:
        return [self._token] if self._token else []

    def _fetch(self) -> None:
        try:
            access = self._credential.get_token(self._scope)
        except Exception as ex:  # noqa: BLE001  azure-core raises ClientAuthenticationError, az CLIError
            raise KubeError(f"cannot get an Entra ID token for the cluster (the AKS server application "
                            f"{AKS_SERVER_APP}) from your login: {type(ex).__name__}: {str(ex)[:300]}; run "
                            "'az login' again", status=401) from None
        self._token, self._expires_on = access.token, float(access.expires_on)


class _StaticToken:
    """A kubeconfig's own token (local-account clusters): nothing to renew."""

    def __init__(self, token: str) -> None:
        self._token = token

    def current(self) -> str:
        return self._token

    def renew(self) -> bool:
        return False

    def secrets(self) -> list[str]:
        return [self._token]


def connect(kubeconfig: bytes, context: str | None = None, *, credential: Any = None) -> "OfficialKubeClient":
    """A client for ``context`` (default: the kubeconfig's current context), credentials kept in memory.

    ``credential`` (an azure-core TokenCredential, e.g. the az login) gives the token where the kubeconfig's user
    is an exec plugin (Entra ID clusters) or has no credential of its own."""
    from kubernetes import client as k8s

    cluster, user = _select_context(kubeconfig, context)
    server = cluster.get("server") or ""
    if urlsplit(server).scheme not in ("https", "http") or not urlsplit(server).hostname:
        raise KubeError("the kubeconfig's cluster has no https:// server address")
    secrets = [str(user.get(k)) for k in ("token", "client-certificate-data", "client-key-data") if user.get(k)]
    certificate = bool(user.get("client-certificate-data") or user.get("client-certificate"))
    tokens: TokenSource | _StaticToken | None = None
    if user.get("token"):
        tokens = _StaticToken(str(user["token"]))
    elif credential is not None and (user.get("exec") or not certificate):
        tokens = TokenSource(credential)
    elif user.get("exec") or user.get("auth-provider"):
        raise KubeError("the cluster's kubeconfig asks for an Entra ID token (kubelogin) and no login was given to "
                        "take it from: run the command through az, logged in ('az login')")
    configuration: Any = k8s.Configuration(host=server.rstrip("/"))
    files = _PrivateFiles()
    try:
        _tls(configuration, cluster, user, files)
    except BaseException:
        files.close()
        raise
    if tokens is not None:
        configuration.api_key = {"authorization": ""}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        configuration.refresh_api_key_hook = lambda c: c.api_key.__setitem__("authorization", tokens.current())
    configuration.retries = _retries()
    return OfficialKubeClient(configuration, tokens, files, secrets)


def _select_context(kubeconfig: bytes, context: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
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


def _named(doc: dict[str, Any], section: str, name: str | None, field: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get(field) or {}
    known = ", ".join(str(e.get("name")) for e in doc.get(section) or [] if isinstance(e, dict)) or "none"
    raise KubeError(f"the kubeconfig has no {field} named {name!r} (it has: {known})")


def _tls(configuration: Any, cluster: dict[str, Any], user: dict[str, Any], files: "_PrivateFiles") -> None:
    """The server's CA (from memory), SNI name, and a client certificate where the kubeconfig has one."""
    ca = cluster.get("certificate-authority-data")
    if ca:
        configuration.ca_cert_data = _b64_text(ca, "certificate-authority-data")
    elif cluster.get("certificate-authority"):
        configuration.ssl_ca_cert = cluster["certificate-authority"]  # the user's own file
    else:
        import certifi

        configuration.ssl_ca_cert = certifi.where()
    configuration.verify_ssl = not cluster.get("insecure-skip-tls-verify")
    if cluster.get("tls-server-name"):
        configuration.tls_server_name = cluster["tls-server-name"]
    cert, key = user.get("client-certificate-data"), user.get("client-key-data")
    if cert and key:
        configuration.cert_file = files.add("client-cert", _b64_text(cert, "client-certificate-data").encode())
        configuration.key_file = files.add("client-key", _b64_text(key, "client-key-data").encode())
        _check_certificate(configuration.cert_file, configuration.key_file)
    elif user.get("client-certificate") and user.get("client-key"):
        configuration.cert_file, configuration.key_file = user["client-certificate"], user["client-key"]


def _b64_text(value: str, field: str) -> str:
    try:
        return base64.b64decode(value, validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        raise KubeError(f"the kubeconfig's {field} is not base64 PEM") from None


def _check_certificate(cert_file: str, key_file: str) -> None:
    import ssl

    try:
        ssl.create_default_context().load_cert_chain(cert_file, key_file)
    except ssl.SSLError:
        raise KubeError("the kubeconfig's client certificate and key do not load") from None


class _PrivateFiles:
    """Paths for secrets that the TLS layer only reads from files: anonymous in-memory files (Linux memfd, never
    on a disk) held open while the client lives; elsewhere a private (0700) temporary folder. ``close()`` ends
    both."""

    def __init__(self) -> None:
        self._fds: list[int] = []
        self._folder: str | None = None

    def add(self, name: str, data: bytes) -> str:
        if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
            fd = os.memfd_create(f"elastictrain-{name}", getattr(os, "MFD_CLOEXEC", 0))
            os.write(fd, data)
            self._fds.append(fd)
            return f"/proc/self/fd/{fd}"
        import tempfile

        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="elastictrain-")  # mode 0700
        path = os.path.join(self._folder, name + ".pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        return path

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        if self._folder is not None:
            import shutil

            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


class OfficialKubeClient:
    """:class:`KubeClient` on the official ``kubernetes`` client; ``close()`` it (or use it in ``with``)."""

    def __init__(self, configuration: Any, tokens: TokenSource | _StaticToken | None, files: _PrivateFiles,
                 secrets: list[str]) -> None:
        import shutil
        import tempfile
        import weakref

        from kubernetes import client as k8s

        self._tokens, self._files, self._secrets = tokens, files, list(secrets)
        self._api: Any = k8s.ApiClient(configuration)
        self._api.user_agent = "az-elastictrain"
        # API discovery is cached in a file (the library's design); a private (0700) folder of this client's,
        # removed at close() (or when the client is collected), so nothing about the cluster outlives the command.
        self._discovery_folder = tempfile.mkdtemp(prefix="elastictrain-discovery-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._discovery_folder, True)
        weakref.finalize(self, files.close)
        self._dynamic: Any = None

    @property
    def _server(self) -> str:
        return str(self._api.configuration.host)

    def __repr__(self) -> str:  # never the credentials
        return f"OfficialKubeClient({self._server!r})"

    def close(self) -> None:
        self._api.close()
        self._files.close()
        self._cleanup()

    def __enter__(self) -> "OfficialKubeClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- KubeClient ----------------------------------------------------------------------------------------------
    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        what = _describe(obj.get("kind"), meta.get("name"), meta.get("namespace"))

        def send() -> dict[str, Any]:
            resource = self._resource(obj["apiVersion"], obj["kind"])
            if resource is None:
                raise KubeError(f"cannot apply {what}: the cluster does not serve {obj['kind']} in "
                                f"{obj['apiVersion']} (is its CustomResourceDefinition installed?)", status=404)
            applied: dict[str, Any] = resource.server_side_apply(
                body=obj, name=meta["name"], namespace=meta.get("namespace"), field_manager=FIELD_MANAGER,
                _request_timeout=(_CONNECT_TIMEOUT_S, _READ_TIMEOUT_S)).to_dict()
            if obj.get("kind") == "Secret":  # what the API server answered holds the value: never handed up
                applied.pop("data", None)
                applied.pop("stringData", None)
            return applied

        return self._call(f"apply {what}", send)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        from kubernetes.dynamic.exceptions import NotFoundError

        def send() -> dict[str, Any] | None:
            resource = self._resource(api_version, kind, namespace, name)
            if resource is None:
                return None
            try:
                found: dict[str, Any] = resource.get(
                    name=name, namespace=namespace, _request_timeout=(_CONNECT_TIMEOUT_S, _READ_TIMEOUT_S)).to_dict()
                return found
            except NotFoundError:
                return None

        return self._call(f"get {_describe(kind, name, namespace)}", send)

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        from kubernetes.dynamic.exceptions import NotFoundError

        def send() -> list[dict[str, Any]]:
            resource = self._resource(api_version, kind)
            items: list[dict[str, Any]] = []
            token = None
            while resource is not None:
                try:
                    page = resource.get(namespace=namespace if resource.namespaced else None,
                                        label_selector=label_selector, limit=_PAGE_SIZE, _continue=token,
                                        _request_timeout=(_CONNECT_TIMEOUT_S, _READ_TIMEOUT_S)).to_dict()
                except NotFoundError:
                    return items
                items += [{"apiVersion": api_version, "kind": kind, **item} for item in page.get("items") or []]
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    break
            return items

        return self._call(f"list {kind}", send)

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        from kubernetes.dynamic.exceptions import NotFoundError

        def send() -> bool:
            resource = self._resource(api_version, kind, namespace, name)
            if resource is None:
                return False
            try:
                resource.delete(name=name, namespace=namespace, propagation_policy="Background",
                                _request_timeout=(_CONNECT_TIMEOUT_S, _READ_TIMEOUT_S))
            except NotFoundError:
                return False
            return True

        return self._call(f"delete {_describe(kind, name, namespace)}", send)

    def pod_logs(self, name: str, namespace: str, container: str | None = None, follow: bool = False,
                 tail: int | None = None) -> Iterator[str]:
        what = f"read the log of {_describe('Pod', name, namespace)}"
        response = self._call(what, lambda: self._open_log(name, namespace, container, follow=follow,
                                                           tail=tail, since=None))
        if not follow:
            return _lines(response)
        return self._followed(response, name, namespace, container)

    def watch(self, api_version: str, kind: str, name: str, namespace: str | None = None,
              timeout: float = 60.0) -> Iterator[tuple[str, dict[str, Any]]]:
        resource = self._call(f"watch {kind}", lambda: self._resource(api_version, kind))
        if resource is None:
            return iter(())
        return self._watched(resource, name, namespace, timeout)

    # -- helpers -------------------------------------------------------------------------------------------------
    def _watched(self, resource: Any, name: str, namespace: str | None,
                 timeout: float) -> Iterator[tuple[str, dict[str, Any]]]:
        """The watch's events. A 401 when it opens (the request goes out at the first event) is answered once
        with a new token, as _call answers one; once events came, the stream's end is the caller's to handle."""
        from kubernetes import watch

        for attempt in (1, 2):
            watcher: Any = watch.Watch()
            stream = resource.watch(namespace=namespace, name=name, timeout=max(1, int(timeout)), watcher=watcher)
            opened = False
            try:
                for event in self._guarded(f"watch {resource.kind} {name}", stream):
                    opened = True
                    yield event["type"], event["raw_object"]
                return
            except KubeError as error:
                if (error.status == 401 and not opened and attempt == 1 and self._tokens is not None
                        and self._tokens.renew()):
                    continue
                raise
            finally:
                watcher.stop()

    def _guarded(self, action: str, stream: Iterator[Any]) -> Iterator[Any]:
        """A stream whose failures become KubeErrors."""
        while True:
            try:
                item = next(stream)
            except StopIteration:
                return
            except Exception as ex:  # noqa: BLE001  mapped (or re-raised) by _kube_error
                raise self._kube_error(action, ex) from None
            yield item

    def _open_log(self, name: str, namespace: str, container: str | None, *, follow: bool, tail: int | None,
                  since: int | None) -> Any:
        from kubernetes import client as k8s

        options: dict[str, Any] = {}
        if container:
            options["container"] = container
        if follow:
            options["follow"] = True
        if tail is not None:
            options["tail_lines"] = tail
        if since is not None:
            options["since_seconds"] = since
        return k8s.CoreV1Api(self._api).read_namespaced_pod_log(
            name, namespace, timestamps=True if follow else None, _preload_content=False,
            _request_timeout=(_CONNECT_TIMEOUT_S, FOLLOW_READ_TIMEOUT_S if follow else _READ_TIMEOUT_S), **options)

    def _followed(self, response: Any, name: str, namespace: str, container: str | None) -> Iterator[str]:
        """A followed log. When the connection stays silent past FOLLOW_READ_TIMEOUT_S it is opened again from a
        little before the last line shown (sinceSeconds, with a margin for clock skew), and what was already shown
        - by its timestamp - is left out. Lines come with their RFC 3339 timestamps (asked for this), cut off
        here."""
        import urllib3

        last, count = None, 0  # the newest timestamp shown, and how many lines carried it
        skip_before, skip_same = None, 0
        while True:
            try:
                for line in _lines(response, raise_timeouts=True):
                    stamp, _, text = line.partition(" ")
                    if skip_before is not None:
                        if stamp < skip_before or (stamp == skip_before and skip_same > 0):
                            skip_same -= stamp == skip_before
                            continue
                        skip_before = None
                    last, count = stamp, (count + 1 if stamp == last else 1)
                    yield text
                return  # the container exited: the server ended the stream
            except urllib3.exceptions.ReadTimeoutError:
                pass
            skip_before, skip_same = last, count
            since = _seconds_since(last) if last else None
            response = self._call(f"read the log of {_describe('Pod', name, namespace)}",
                                  lambda: self._open_log(name, namespace, container, follow=True, tail=None,
                                                         since=since))

    def _resource(self, api_version: str, kind: str, namespace: str | None = None,
                  name: str | None = None) -> Any:
        """The kind's discovered resource, or None where the cluster does not serve it (a CRD may be on its way:
        discovery is asked again next time)."""
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        dynamic = self._discovery()
        try:
            # the core group's prefix named, else a search for "v1" reads the v1 of every group (apps, batch, ...)
            where = {"prefix": "api"} if api_version == "v1" else {}
            resource = dynamic.resources.get(api_version=api_version, kind=kind, **where)
        except ResourceNotFoundError:
            return None
        if resource.namespaced and not namespace and name is not None:
            raise ValueError(f"{kind} {name!r} is namespaced: give its namespace")
        return resource

    def _discovery(self) -> Any:
        if self._dynamic is None:
            from kubernetes import dynamic

            cache = os.path.join(self._discovery_folder, "discovery.json")
            self._dynamic = dynamic.DynamicClient(self._api, cache_file=cache)
        return self._dynamic

    def _call(self, action: str, send: Callable[[], T]) -> T:
        """``send()``, its errors as KubeErrors; a 401 is answered once with a new token from the credential."""
        for attempt in (1, 2):
            try:
                return send()
            except KubeError:
                raise
            except Exception as ex:  # noqa: BLE001
                error = self._kube_error(action, ex)
                if error.status == 401 and attempt == 1 and self._tokens is not None and self._tokens.renew():
                    self._secrets += self._tokens.secrets()
                    continue
                raise error from None
        raise AssertionError("unreachable")

    def _kube_error(self, action: str, ex: Exception) -> KubeError:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        if isinstance(ex, KubeError):
            return ex
        if isinstance(ex, ApiException):
            status = ex.status
            try:
                body = json.loads(ex.body) if ex.body else {}
            except (TypeError, ValueError):
                body = {}
            body = body if isinstance(body, dict) else {}
            reason = body.get("reason") or (ex.reason if status not in (None, 0) else None)
            message = body.get("message") or "no details"
            return KubeError(self._redact(f"{action} failed: HTTP {status}{f' {reason}' if reason else ''}: "
                                          f"{message}{_HINTS.get(status, '')}"), status=status, reason=reason)
        if isinstance(ex, (urllib3.exceptions.HTTPError, OSError)):
            reason = getattr(ex, "reason", None) or ex
            return KubeError(self._redact(f"cannot reach the Kubernetes API server {self._server}: "
                                          f"{type(reason).__name__}: {reason}"))
        if isinstance(ex, ValueError):
            raise ex
        return KubeError(self._redact(f"{action} failed: {type(ex).__name__}: {ex}"))

    def _redact(self, text: str) -> str:
        for secret in [*self._secrets, *(self._tokens.secrets() if self._tokens else [])]:
            if secret:
                text = text.replace(secret, "<redacted>")
        return text


def _lines(response: Any, *, raise_timeouts: bool = False) -> Iterator[str]:
    """A streamed text body, line by line (a last line without its end included)."""
    import urllib3

    pending = b""
    try:
        # read1: what has arrived (up to 8 KiB), so a line is shown when it comes, not once 8 KiB are there
        for chunk in iter(lambda: response.read1(8192), b""):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", errors="replace")
    except urllib3.exceptions.ReadTimeoutError:
        if raise_timeouts:
            raise
        raise KubeError("the log stream stopped answering") from None
    except urllib3.exceptions.HTTPError as ex:
        raise KubeError(f"the log stream broke off: {type(ex).__name__}") from None
    finally:
        response.release_conn()
    if pending:
        yield pending.decode("utf-8", errors="replace")


def _seconds_since(stamp: str, margin: int = 5) -> int:
    """Whole seconds from an RFC 3339 timestamp (2026-11-23T12:00:00.123456789Z) to now, plus ``margin``."""
    import datetime
    import math

    try:
        then = datetime.datetime.fromisoformat(stamp.split(".")[0].rstrip("Z") + "+00:00")
    except ValueError:
        return 3600  # not a timestamp: an hour back, the lines already shown are still left out
    elapsed = (datetime.datetime.now(datetime.timezone.utc) - then).total_seconds()
    return max(1, math.ceil(elapsed) + margin)


def _describe(kind: str | None, name: str | None, namespace: str | None) -> str:
    return f"{kind} {namespace + '/' if namespace else ''}{name}"


def _retries() -> Any:
    import urllib3

    # Server-side apply, get and delete are idempotent: retry what a busy API server answers.
    return urllib3.Retry(total=3, connect=3, read=1, status=3, backoff_factor=0.25, raise_on_status=False,
                         status_forcelist=(429, 502, 503, 504), allowed_methods=("GET", "PATCH", "DELETE"))
