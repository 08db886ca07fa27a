"""The README's main job, as a newcomer runs it: scripts/demo.py drives the whole story through the real az."""
from __future__ import annotations

import json
import subprocess
import sys

from azext_elastictrain.core import launch
from harness import services as svc
from tests.support.prices_server import PricesServer
from tests.support.processes import ours

STEPS, INTERVAL = 600, 40


def test_the_demo_survives_two_evictions_and_finishes_every_step(tmp_path):
    svc.check_dev_extension()
    out, config = tmp_path / "out", tmp_path / "azure-config"
    front = PricesServer()  # the Retail Prices API's shape, the tests' own figures (Azure is not reachable here)
    try:
        run = subprocess.run([sys.executable, "scripts/demo.py", "--steps", str(STEPS), "--out", str(out),
                              "--config-dir", str(config), "--prices-url", front.url], cwd=svc.REPO_ROOT,
                             env=svc.az_env(config), capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        assert "Traceback" not in run.stderr
        summary = json.loads((out / "summary.json").read_text())

        assert summary["state"] == "Succeeded" and summary["step"] == STEPS
        # the local default: in-process, which passes the battery of users' scripts (test_battery.py) too
        assert summary["recovery"] == launch.DEFAULT_RECOVERY["local"] == launch.RECOVERY_IN_PROCESS
        assert "  recovery           --recovery in-process" in run.stdout
        # each eviction shrank the job, capacity grew it back; the job's first quorum may form before the
        # second node is heard, then it joins at a later step
        assert summary["worldSizes"] in ([2, 1, 2, 1, 2], [1, 2, 1, 2, 1, 2]), summary["worldSizes"]
        notice, sudden = summary["evictions"]
        assert notice["notice"] and notice["acknowledged"] and notice["stepsLost"] == 0, notice
        # without notice the survivor's step in flight is discarded and trained again: none lost
        assert not sudden["notice"] and sudden["stepsLost"] == 0, sudden
        # the node vanished (no peer told): the survivor found out by a timeout (the coordinator's heartbeat,
        # or the step's collective), then trained on
        assert 0 < sudden["outageSeconds"] <= launch.LOCAL.replica_timeout_seconds + 10, sudden
        # the outage with notice runs from the survivors' last step before the node left the quorum; the
        # survivor never stopped, so from the kill to its first step after it is about nothing
        assert notice["outageSeconds"] > 0 and 0 <= notice["recoverySeconds"] <= notice["outageSeconds"], notice
        assert sudden["node"] == notice["replacement"]["node"]  # --count 1 takes the newest node
        assert notice["worldSize"] == sudden["worldSize"] == 1
        assert all(e["capacityBack"]["worldSize"] == 2 for e in summary["evictions"])
        for back in (e["capacityBack"] for e in summary["evictions"]):  # each scale-up, from the job's events
            # the newcomer took the state from the live survivor: no blob restore, no step lost
            assert back["restoreSource"] == "peer", back
            assert back["stepsLost"] == 0 and 0 <= back["noTrainingSeconds"] <= back["nodeJoinedToFullSizeSeconds"]
            assert back["noTrainingSeconds"] <= back["outageSeconds"] <= 10, back  # the outage ends at a step
        assert summary["lossEnd"]["loss"] < summary["lossStart"]["loss"]
        assert summary["checkpointsKept"] == [STEPS - INTERVAL, STEPS]  # pruned to the newest 2
        assert (out / "timeline.png").stat().st_size > 10_000
        cost = summary["cost"]  # the job's node-hours as Spot NC4as T4 v3 nodes in eastus
        hours = sum(cost["nodeHours"].values())
        assert hours > 0 and abs(cost["cost"] - hours * 0.0789) < 1e-4 and cost["savedPercent"] == 85.0, cost
        assert "  cost               " in run.stdout and "saved 85%" in run.stdout
        for command in ("cluster create --local", "job run --local", "evict simulate --local",
                        "checkpoint prune --local"):
            assert f"$ az elastictrain {command}" in run.stdout  # every step went through az
    finally:
        front.close()
        leftovers = ours(config)
        for proc in leftovers:
            proc.kill()
    assert not leftovers, f"the demo left processes running: {[p.pid for p in leftovers]}"
