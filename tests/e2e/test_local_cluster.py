"""az elastictrain cluster create|show|list|delete --local through the real az: real processes, checked by pid."""
from __future__ import annotations

import os

import psutil
import pytest

from tests.support.processes import gone as _gone
from tests.support.processes import ours as _ours
from tests.support.processes import running as _running


@pytest.fixture
def cluster_az(az):
    yield az
    for proc in _ours(az.config_dir):  # never leave a stray process behind, whatever failed
        proc.kill()


def _pids(shown: dict) -> dict[str, int]:
    return {k: v["pid"] for k, v in shown["components"].items()}


def test_create_is_idempotent_heals_a_dead_component_and_delete_stops_exactly_its_processes(cluster_az):
    az = cluster_az
    created = az.json("elastictrain", "cluster", "create", "--local", timeout=180)
    assert created["health"] == "Healthy"
    pids = _pids(created)
    assert set(pids) == {"etcd", "azurite", "scheduled-events"} and all(_running(p) for p in pids.values())

    again = az.json("elastictrain", "cluster", "create", "--local", timeout=180)
    assert _pids(again) == pids, "a second create must leave a healthy cluster alone"

    psutil.Process(pids["azurite"]).kill()
    assert _gone([pids["azurite"]])
    assert az.json("elastictrain", "cluster", "show", "--local")["health"] == "Degraded"
    # An unreachable cluster: clear errors that say how to heal it, and nothing starts.
    refused = az("elastictrain", "job", "run", "--local", "--name", "j", "--script", "scripts/train_cifar10.py",
                 "--min-nodes", "1", "--max-nodes", "1", check=False)
    assert refused.returncode != 0 and "is Degraded (azurite not running)" in refused.stderr, refused.stderr
    assert "cluster create --local" in refused.stderr and "Traceback" not in refused.stderr
    assert not (az.config_dir / "elastictrain" / "local" / "local" / "jobs" / "j").exists()
    unreachable = az("elastictrain", "checkpoint", "list", "--local", "--job", "j", check=False, timeout=180)
    assert unreachable.returncode != 0 and "cannot reach blob storage" in unreachable.stderr, unreachable.stderr
    assert "Is local cluster 'local' healthy?" in unreachable.stderr and "Traceback" not in unreachable.stderr
    healed = az.json("elastictrain", "cluster", "create", "--local", timeout=180)
    assert healed["health"] == "Healthy"
    assert _pids(healed)["etcd"] == pids["etcd"] and _pids(healed)["azurite"] != pids["azurite"]
    assert [c["name"] for c in az.json("elastictrain", "cluster", "list", "--local")] == ["local"]

    plan = az.json("elastictrain", "cluster", "delete", "--local", "--dry-run")
    assert sorted(p["pid"] for p in plan["stopped"]) == sorted(_pids(healed).values())
    unconfirmed = az("elastictrain", "cluster", "delete", "--local", check=False)
    assert unconfirmed.returncode != 0 and "--yes" in unconfirmed.stderr
    assert all(_running(p) for p in _pids(healed).values()), "nothing stops before confirmation"

    az("elastictrain", "cluster", "delete", "--local", "--yes")
    assert _gone(_pids(healed).values())
    assert not _ours(az.config_dir)
    missing = az("elastictrain", "cluster", "show", "--local", check=False)
    assert missing.returncode == 3 and "no local cluster named 'local'" in missing.stderr


@pytest.mark.parametrize("args, env, expected", [
    (["--name", "Bad_Name"], {}, "invalid local cluster name"),
    (["--name", "x" * 40], {}, "invalid local cluster name"),
    (["--engine", "k8s-job", "--max-count", "2"], {}, "--max-count, --engine: only for a cluster on Azure"),
    (["--gpu-vm-size", "Standard_NC4as_T4_v3"], {}, "--gpu-vm-size: only for a cluster on Azure"),
    (["--maintenance-window", "Sunday 02:00 4", "--encryption-at-host", "false"], {},
     "--maintenance-window, --encryption-at-host: only for a cluster on Azure"),
    ([], {"AZURITE_BIN": "/nonexistent/azurite-blob"}, "is not an executable file"),
    ([], {"ETCD_BIN": "/nonexistent/etcd"}, "is not an executable file"),
])
def test_a_failed_create_is_a_clear_error_and_leaves_nothing_behind(cluster_az, args, env, expected):
    az = cluster_az
    result = az("elastictrain", "cluster", "create", "--local", *args, check=False, env=env, timeout=180)
    assert result.returncode != 0 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not _ours(az.config_dir), "a failed create left processes running"
    assert not os.path.exists(os.path.join(az.config_dir, "elastictrain", "local", "local")), "state left behind"


def test_cluster_commands_need_a_place_to_run(cluster_az):
    result = cluster_az("elastictrain", "cluster", "create", check=False)
    assert result.returncode != 0 and "--local" in result.stderr and "Traceback" not in result.stderr
    shown = cluster_az("elastictrain", "cluster", "show", "--local", "--name", "nothere", check=False)
    assert shown.returncode == 3 and "nothere" in shown.stderr
