"""scripts/bench/gpu.py, the device script of issue 33, run on CPU with its tiny state: so that it cannot rot
between the runs on a GPU. Its figures are not checked here (no timed tests); what it did is."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_device_script_runs_every_phase_on_cpu_with_a_tiny_state(tmp_path) -> None:
    pytest.importorskip("torchft")
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / "gpu.py"), "--device", "cpu", "--tiny",
                           "--timeout", "150", "--memory-dir", str(tmp_path), "--json", str(out)],
                          capture_output=True, text=True, timeout=180, cwd=REPO, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == result, "the JSON on stdout is the file's"
    assert result["device"] == "cpu" and result["state"]["bytes"] > 0
    snap = result["phases"]["snapshot"]
    assert snap["bytes"] > 0 and len(snap["runs"]) == 4
    assert all(r["to_committed_s"] >= r["copies_landed_s"] >= r["blocking_s"] > 0 and r["gb_per_s"] > 0
               and r["slot_and_checksum_s"] > 0 for r in snap["runs"])
    steps = result["phases"]["overhead"]
    assert steps["rows"] == 64 and len(steps["steps"]["plain"]) == len(steps["steps"]["kept"]) == 6
    assert steps["step_s"] > 0 and steps["step_kept_s"] > 0 and steps["overhead"] > -1
    heal = result["phases"]["heal"]
    assert list(heal["phases_s"]) == ["start", "import_torch", "import_runtime", "build", "receive", "load",
                                      "first_step"]
    assert heal["parameters_on"] == ["cpu"] and heal["to_first_step_s"] >= sum(heal["phases_s"].values()) * 0.99
    assert heal["same_as_peer"] is True, "the newcomer's first step started from the peer's weights"
    for part, layers in (("quarter", 1), ("full", 4)):  # the tiny state's 4 layers, a quarter first
        saved = result["phases"]["dcp"][part]
        assert saved["layers"] == layers and saved["restored_step"] == 1 and saved["restored_on"] == ["cpu"]
        assert saved["same_as_saved"] is True, part
        assert saved["save_to_committed_s"] >= saved["save_stall_s"] > 0 and saved["restore_s"] > 0
    assert result["phases"]["dcp"]["quarter"]["bytes"] * 4 == result["phases"]["dcp"]["full"]["bytes"]
    killed = result["phases"]["readme_sigkill"]
    assert killed["restored_from"] == "memory" and killed["stepsLost"] <= 1, killed  # 1: killed mid-commit
    assert killed["recoverySeconds"] >= killed["restoreSeconds"] >= 0 and killed["worldSize"] == 1


def test_the_device_script_ends_itself_at_its_timeout_with_what_it_has(tmp_path) -> None:
    pytest.importorskip("torchft")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / "gpu.py"), "--device", "cpu", "--tiny",
                           "--timeout", "0.5", "--memory-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    assert done.returncode == 124, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["timed_out_after_s"] == 0.5
