"""The user's install path: the built wheel, ``az extension add --source``, then the extension at work.

No dev-source environment here: az finds the extension only in a fresh AZURE_EXTENSION_DIR, where
``az extension add`` put it, the way a user who downloaded the wheel gets it.  Azurite is found on PATH (a user
installs it with npm), etcd as the other tests find it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harness import services as svc
from tests.support.processes import gone, ours

REPO_ROOT = Path(__file__).resolve().parents[2]
AZURITE_BIN_DIR = REPO_ROOT / ".tools" / "node_modules" / ".bin"


def _version(root: Path = REPO_ROOT) -> str:
    for line in (root / "setup.py").read_text(encoding="utf-8").splitlines():
        if line.startswith("VERSION = "):
            return line.split('"')[1]
    raise AssertionError("no VERSION in setup.py")


def _build(root: Path, out: Path) -> Path:
    built = subprocess.run(["bash", str(root / "scripts" / "build.sh"), str(out)], capture_output=True, text=True,
                           timeout=300, check=False, env=dict(os.environ, ELASTICTRAIN_BUILD_PYTHON=sys.executable))
    assert built.returncode == 0, built.stderr
    wheel = Path(built.stdout.strip().splitlines()[-1])
    assert wheel.name == f"elastictrain-{_version(root)}-py3-none-any.whl" and wheel.is_file(), wheel
    return wheel


def _next_release(tmp: Path) -> Path:
    """This tree's package with the next patch VERSION: what a user's upgrade installs."""
    root = tmp / "next"
    for name in ("setup.py", "README.md", "scripts/build.sh"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, root / name)
    shutil.copytree(REPO_ROOT / "azext_elastictrain", root / "azext_elastictrain",
                    ignore=shutil.ignore_patterns("__pycache__"))
    major_minor, patch = _version().rsplit(".", 1)
    setup = root / "setup.py"
    setup.write_text(setup.read_text(encoding="utf-8").replace(f'VERSION = "{_version()}"',
                                                               f'VERSION = "{major_minor}.{int(patch) + 1}"'),
                     encoding="utf-8")
    return root


class _UserAz:
    """The real az with its own config and extension folders and no dev extension."""

    def __init__(self, root: Path) -> None:
        self.config_dir = root / "azure-config"
        self.extension_dir = root / "azure-extensions"
        self.az = svc.az_binary()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
        env.update(AZURE_CONFIG_DIR=str(self.config_dir), AZURE_EXTENSION_DIR=str(self.extension_dir),
                   AZURE_CORE_COLLECT_TELEMETRY="false", AZURE_CORE_NO_COLOR="true",
                   AZURE_CORE_SURVEY_MESSAGE="false",
                   PATH=os.pathsep.join([str(AZURITE_BIN_DIR), env.get("PATH", "")]))
        env.pop("PYTHONPATH", None)
        self.env = env

    def __call__(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
        result = subprocess.run([self.az, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                                stdin=subprocess.DEVNULL, cwd=str(self.config_dir.parent), check=False)
        if check and result.returncode != 0:
            raise svc.AzCommandError(result)
        return result

    def json(self, *args: str, timeout: float = 180):
        return json.loads(self(*args, "-o", "json", timeout=timeout).stdout)


@pytest.fixture
def user_az(tmp_path):
    az = _UserAz(tmp_path)
    yield az
    for proc in ours(az.config_dir):  # never leave a stray process behind, whatever failed
        proc.kill()


@pytest.mark.slow  # ~60 s: builds the wheel, installs it into a fresh az, runs a local cluster
def test_the_built_wheel_installs_with_az_extension_add_and_runs_a_local_cluster(tmp_path, user_az):
    wheel = _build(REPO_ROOT, tmp_path / "dist")

    az = user_az
    assert "elastictrain" not in az("--help").stdout.split("Commands:")[0]  # nothing loaded before the install
    az("extension", "add", "--source", str(wheel), "--yes")
    [installed] = az.json("extension", "list")
    assert installed["name"] == "elastictrain" and installed["version"] == _version(), installed
    assert installed["extensionType"] == "whl" and installed["preview"] is True, installed
    assert Path(installed["path"]).resolve() == (az.extension_dir / "elastictrain").resolve(), installed

    shown = az("elastictrain", "--help")
    for group in ("cluster", "job", "checkpoint", "evict"):
        assert f"\n    {group} " in shown.stdout, shown.stdout

    created = az.json("elastictrain", "cluster", "create", "--local")
    assert created["health"] == "Healthy", created
    pids = {name: c["pid"] for name, c in created["components"].items()}
    assert set(pids) == {"etcd", "azurite", "scheduled-events"}
    # The extension's own Python process (the Scheduled Events endpoint) runs the installed copy, not this tree.
    server = psutil.Process(pids["scheduled-events"])
    assert server.environ()["PYTHONPATH"].split(os.pathsep)[0] == str(az.extension_dir / "elastictrain")

    assert [c["name"] for c in az.json("elastictrain", "cluster", "list", "--local")] == ["local"]
    az("elastictrain", "cluster", "delete", "--local", "--yes")
    assert gone(pids.values()), "cluster delete left a component running"
    assert az.json("elastictrain", "cluster", "list", "--local") == []

    # README's update path: the same version again changes nothing; a newer wheel replaces it with --upgrade.
    again = az("extension", "add", "--source", str(wheel), "--yes")
    assert "already installed" in again.stderr, again.stderr
    newer = _build(_next_release(tmp_path), tmp_path / "dist-next")
    kept = az("extension", "add", "--source", str(newer), "--yes")
    assert "already installed" in kept.stderr and az.json("extension", "list")[0]["version"] == _version()
    az("extension", "add", "--source", str(newer), "--upgrade", "--yes")
    [upgraded] = az.json("extension", "list")
    assert upgraded["version"] == _version(newer.parents[1] / "next") != _version(), upgraded
    assert "\n    cluster " in az("elastictrain", "--help").stdout
