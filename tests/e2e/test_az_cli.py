"""The real az (.venv/bin/az) loads this checkout as a dev extension."""
from __future__ import annotations

from harness import services as svc


def test_group_help(az: svc.AzCli) -> None:
    result = az("elastictrain", "--help")
    assert result.returncode == 0
    assert "checkpoint" in result.stdout, result.stdout


def test_listed_as_dev_extension(az: svc.AzCli) -> None:
    extensions = az.json("extension", "list")
    ours = [e for e in extensions if e.get("name") == svc.EXTENSION_NAME]
    assert ours, f"elastictrain not in `az extension list`: {[e.get('name') for e in extensions]}"
    assert ours[0].get("extensionType") == "dev", ours[0]
    assert ours[0].get("path", "").endswith(f"azext-dev/{svc.EXTENSION_NAME}"), ours[0]


def test_checkpoint_list_help(az: svc.AzCli) -> None:
    result = az("elastictrain", "checkpoint", "list", "--help")
    assert result.returncode == 0
    assert "checkpoint list" in result.stdout, result.stdout
