"""A node that vanishes in the restart mode never stalls the job for the timeout of the script's process group.

Two real torchrun agents (etcd-v2 rendezvous, Azurite) with the AKS settings (rendezvous keep-alive, collective
timeout) and the runtime's default peer timeout train a script users have, through tests/support/readme_harness.py:
the loop of per-step hooks with ``init_process_group("gloo")`` and no timeout (torch's 30 minutes), and the README's
script (``timeout=collective_timeout()``: the AKS collective timeout, 60 s). While both train, node-b vanishes as a
Spot VM evicted without notice does: every process frozen, its sockets open, and it stays frozen until the survivor
trained again without it (the local backend's cap off: nothing tells the survivor). The survivor's worker ends
itself once node-b's beat stops (runtime/peer_watch.py) and the job re-forms: the outage is under the AKS collective
timeout (before, the hooks loop waited until the node was killed, and the README's script the collective timeout and
a re-form), the survivor resumes from its memory at the last step it completed (no step lost), each sample is trained
once in the order of an uninterrupted run, and the job is Succeeded at its end.
"""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from azext_elastictrain.core import launch
from azext_elastictrain.core.eventlog import goodput
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.core.eventlog.recovery import trained_again
from tests.e2e.test_readme import README, _check_exactly_once, _history, python_blocks
from harness.elastic import JobConfig, Node, dump, events_of, read_events, wait_for

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "support" / "readme_harness.py"
HOOKS_LOOP = REPO / "tests" / "support" / "legacy_loop.py"
# The frozen node is killed after this at the latest: past it the survivor learned of the vanish from the kill,
# which Azure never gives. Old code: the hooks loop's survivor waited until then; the README's, 60 s and a re-form.
FROZEN_AT_MOST = 150


def _scripts() -> dict[str, tuple[str, str]]:
    """Each script, and the seconds the harness sleeps in each step (before the runtime's per-step collective)."""
    hooks = HOOKS_LOOP.read_text()
    # No timeout, and the step's time spent before DDP's all-reduce in backward (a model's forward): the vanish
    # lands there, and the survivor waits in the script's group, not in one of the runtime's.
    bare = hooks.replace('dist.init_process_group("gloo", timeout=collective_timeout())', 'dist.init_process_group("gloo")')
    bare = bare.replace("        loss.backward()\n", "        time.sleep(0.5 if os.path.exists(os.environ['READMETEST_SLOW']) else 0)\n"
                        "        loss.backward()\n")
    assert bare.count("time.sleep") == 1 and "timeout" not in bare.split("init_process_group")[1].split("\n")[0]
    return {"hooks-no-timeout": ("import os\nimport time\n" + bare, "0"),
            "readme": (python_blocks(README.read_text())[0], "0.5")}


@pytest.mark.torchrun
@pytest.mark.slow
@pytest.mark.parametrize("script", ["hooks-no-timeout", "readme"])
def test_a_vanished_node_costs_the_peer_timeout_and_a_re_form_whatever_the_scripts_timeout(
        script, azurite, etcd, container_url, tmp_path):
    path = tmp_path / f"{script}.py"
    source, delay = _scripts()[script]
    path.write_text(source)
    out, slow = tmp_path / "records", tmp_path / "slow"
    slow.touch()
    name = f"vanish-{uuid.uuid4().hex[:8]}"
    config = JobConfig(
        name=name, checkpoint_url=f"{container_url}/{name}", connection_string=azurite.connection_string,
        etcd_endpoint=etcd.endpoint, script=HARNESS, rdzv_conf=launch.AKS.rdzv_conf,
        extra_env={launch.ENV_COLLECTIVE_TIMEOUT: f"{launch.AKS.collective_timeout_seconds:g}",
                   launch.ENV_MEMORY_DIR: str(tmp_path / "shm"), "READMETEST_BLOCK": str(path),
                   "READMETEST_OUT": str(out), "READMETEST_SLOW": str(slow), "READMETEST_STEP_DELAY": delay})
    store = BlobStore.from_url(config.checkpoint_url, connection_string=azurite.connection_string)
    a, b = Node(config, "node-a", tmp_path / "logs"), Node(config, "node-b", tmp_path / "logs")
    try:
        def events() -> list[dict]:
            return read_events(store, store.prefix)

        logs = lambda: f"{a.log_tail()}\n{b.log_tail()}\n{dump(events())}"  # noqa: E731
        wait_for(lambda: len(events_of(events(), "progress", world_size=2)) >= 2, 240, "both nodes training",
                 on_timeout=logs)
        frozen_at = b.vanish(FROZEN_AT_MOST, until=lambda at: trained_again(events(), at))
        slow.unlink()  # the rest at full speed
        assert a.wait(timeout=300) == 0, logs()
        found = events()
        (outage,) = [o for o in goodput.outages(found) if o["restoredAt"] > frozen_at]
        print(f"{script}: outage {outage['outageSeconds']} s, survivor trained again "
              f"{outage['firstStepAt'] - frozen_at:.2f} s after the freeze")  # the figure, with -s
        assert outage["fromWorldSize"] == 2 and outage["toWorldSize"] == 1, outage
        assert outage["outageSeconds"] < launch.AKS.collective_timeout_seconds, (outage, logs())
        assert outage["stepsLost"] == 0 and outage["restoreSource"] == "memory", outage
        history = _history(out)
        _check_exactly_once(history, max(history))
        (finished,) = events_of(found, "finished")
        assert finished["step"] == max(history)
    finally:
        a.stop()
        b.stop()
        store.close()
