"""The local cluster's etcd and Azurite: their programs, command lines and environment, built in one place.

``cluster create --local`` starts its components from these (backends/local/cluster.py), and so do the tests and
benchmarks that need a bare etcd or Azurite (harness/services.py), so what they run is what users run.
Pure but for finding the programs: it builds, the caller starts the process.
"""
from __future__ import annotations

import platform
from pathlib import Path
from typing import Mapping

from azext_elastictrain.backends.local.state import REPO_ROOT, which_tool

LOOPBACK = "127.0.0.1"
#: Where scripts/setup.sh installs Azurite (npm, into the checkout's .tools).
AZURITE_IN_CHECKOUT = REPO_ROOT / ".tools" / "node_modules" / ".bin" / "azurite-blob"


def etcd_binary() -> str:
    return which_tool("ETCD_BIN", [], "etcd", "apt-get install etcd-server (etcd 3.4/3.5: 3.6 has no v2 API)")


def azurite_binary() -> str:
    return which_tool("AZURITE_BIN", [AZURITE_IN_CHECKOUT], "azurite-blob", "npm install -g azurite@3.37.0")


def etcd_argv(binary: str, *, name: str, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    """A one-member etcd on loopback with the v2 API on: torch's etcd rendezvous speaks v2 only."""
    client_url, peer_url = f"http://{LOOPBACK}:{client_port}", f"http://{LOOPBACK}:{peer_port}"
    return [binary, "--name", name, "--data-dir", str(data_dir), "--enable-v2",
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{name}={peer_url}", "--initial-cluster-state", "new"]


def etcd_env(inherited: Mapping[str, str]) -> dict[str, str]:
    """``inherited`` without its ETCD_* variables: etcd reads each as a flag, and the caller's are not ours."""
    env = {k: v for k, v in inherited.items() if not k.startswith("ETCD_")}
    if platform.machine().lower() in ("aarch64", "arm64"):
        env["ETCD_UNSUPPORTED_ARCH"] = "arm64"  # etcd 3.4 refuses to start on arm64 without it
    return env


def azurite_argv(binary: str, *, port: int, location: Path, cert: str | None = None, key: str | None = None,
                 oauth: bool = False) -> list[str]:
    """Azurite's blob service on loopback with its data in ``location``. ``cert``/``key`` (PEM files): HTTPS;
    ``oauth``: bearer tokens admitted too (Azurite checks them only over HTTPS)."""
    argv = [binary, "--blobHost", LOOPBACK, "--blobPort", str(port), "--location", str(location),
            # any SDK's api-version, and headers Azure would ignore: the SDK of the day must work against it
            "--skipApiVersionCheck", "--loose", "--silent",
            # a local cluster sends nothing off this machine
            "--disableTelemetry"]
    if cert:
        argv += ["--cert", str(cert), "--key", str(key)]
    if oauth:
        argv += ["--oauth", "basic"]
    return argv
