"""The README's script, unchanged, as a 2-node `job run --local --recovery in-process` through the real az: the
runtime's in-process loop (per-step quorum through the job's coordinator) trains it to the end and the job is
Succeeded, its final checkpoint in blob."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import services as svc
from tests.support.processes import local_cluster

REPO = Path(__file__).resolve().parents[2]
JOB = "readme-inproc"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("torchft", reason="in-process jobs run torchft (the train extra)")
    try:
        with local_cluster(tmp_path_factory.mktemp("local-readme-in-process") / "azure-config") as az:
            yield az
    except svc.ServiceNotFound as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.mark.slow  # a coordinator, two nodes, 192 steps
def test_the_readme_script_trains_to_the_end_in_process(local, tmp_path):
    az = local
    block = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), flags=re.S | re.M)[0]
    script = tmp_path / "train.py"
    script.write_text(block, encoding="utf-8")
    az.json("elastictrain", "job", "run", "--local", "--name", JOB, "--script", str(script),
            "--min-nodes", "2", "--max-nodes", "2", "--recovery", "in-process", timeout=180)
    done = az.json("elastictrain", "job", "wait", "--local", "--name", JOB, "--state", "Succeeded",
                   "--timeout", "400", timeout=460)
    assert done["state"] == "Succeeded", done
    logs = az("elastictrain", "job", "logs", "--local", "--name", JOB).stdout
    assert "Traceback" not in logs, logs[-4000:]
    quorums = [line for line in logs.splitlines() if "got lighthouse quorum" in line]
    assert any(f"{JOB}-node-0" in q and f"{JOB}-node-1" in q for q in quorums), logs[-4000:]  # trained together
    checkpoints = az.json("elastictrain", "checkpoint", "list", "--local", "--job", JOB)
    assert max(c["step"] for c in checkpoints) == 3 * 4096 // 64, checkpoints
    az.json("elastictrain", "job", "delete", "--local", "--name", JOB, "--yes", timeout=120)
