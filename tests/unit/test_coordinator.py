"""The coordinator of an in-process job (runtime/coordinator.py): the real process on loopback - it listens where
it says, forms quorums with the job's min nodes, and stops cleanly on SIGTERM."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from azext_elastictrain.core import launch
from azext_elastictrain.runtime.coordinator import parse_args, reachable_address

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60  # it imports torch before it listens: seconds on a busy machine


def test_nodes_are_given_the_address_bound_not_the_machines_name():
    assert reachable_address("127.0.0.1:0", "http://vm:41303") == "http://127.0.0.1:41303"
    assert reachable_address("0.0.0.0:29510", "http://vm:29510") == "http://vm:29510"
    assert reachable_address("[::]:29510", "http://vm:29510/") == "http://vm:29510/"


def test_its_defaults_are_the_launch_settings_and_the_timeouts_are_the_backends():
    args = parse_args(["--heartbeat-timeout-ms", "700", "--join-timeout-ms", "900"])
    assert args.bind == f"0.0.0.0:{launch.COORDINATOR_PORT}" and args.min_replicas == 1
    assert (args.join_timeout_ms, args.quorum_tick_ms, args.heartbeat_timeout_ms) == (
        900, launch.COORDINATOR_QUORUM_TICK_MS, 700)
    for missing in ([], ["--heartbeat-timeout-ms", "700"], ["--join-timeout-ms", "900"]):
        with pytest.raises(SystemExit):  # no default of its own: the backend's profile says it (core/launch.py)
            parse_args(missing)
    for profile in (launch.LOCAL, launch.AKS):
        given = parse_args(launch.coordinator_args(profile, bind="127.0.0.1:0", min_nodes=3))
        assert (given.bind, given.min_replicas, given.heartbeat_timeout_ms, given.join_timeout_ms) == (
            "127.0.0.1:0", 3, profile.coordinator_heartbeat_timeout_ms, profile.coordinator_join_timeout_ms)


def test_a_quorum_waits_longer_for_a_heard_node_than_a_step_takes():
    """The join timeout outlasts a step (core/launch.py: a shorter one split a 3-node job with 0.5 s steps into
    alternating majorities), and on AKS it ends before torchft's Manager gives up on its quorum request."""
    from azext_elastictrain.runtime.replicas import QUORUM_TIMEOUT

    assert launch.LOCAL.coordinator_join_timeout_ms >= 1000 * launch.LOCAL.replica_timeout_seconds
    assert launch.AKS.coordinator_join_timeout_ms >= 1000 * launch.AKS.replica_timeout_seconds
    assert launch.AKS.coordinator_join_timeout_ms < QUORUM_TIMEOUT.total_seconds() * 1000


def test_the_coordinator_drops_a_silent_node_after_five_lost_beats_on_both_backends():
    """A node gone without notice costs the survivors this wait (the quorum's watch waits the same): 500 ms, five of
    torchft's 100 ms beats, soaked on 2 cores under two CPU hogs (core/launch.py)."""
    from azext_elastictrain.backends.local.agent import CoordinatorLaunch

    local = parse_args(CoordinatorLaunch(REPO).argv()[3:-1])
    assert local.heartbeat_timeout_ms == launch.LOCAL.coordinator_heartbeat_timeout_ms == 500
    assert launch.AKS.coordinator_heartbeat_timeout_ms == 500
    compared = parse_args(CoordinatorLaunch(REPO, heartbeat_timeout_ms=700).argv()[3:-1])  # what the benches vary
    assert compared.heartbeat_timeout_ms == 700


def _probe():
    pytest.importorskip("torch", reason="the nodes' probe lives in the runtime (the train extra)")
    from azext_elastictrain.runtime.replicas import coordinator_answers

    return coordinator_answers


def test_a_port_that_accepts_but_whose_process_does_not_answer_is_no_coordinator():
    """A coordinator killed with SIGKILL: while its process is torn down (~30 ms here), the kernel still completes
    connections to its port; only its index page says it is up. A node that took the connect for an answer asked it
    for a quorum that never came, while the others coasted."""
    coordinator_answers = _probe()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)  # never accepted: the kernel's handshake, no process behind it
        address = "http://127.0.0.1:%d" % listening.getsockname()[1]
        with socket.create_connection(listening.getsockname(), timeout=1):
            pass  # what the probe used to take for an answer
        began = time.monotonic()
        assert not coordinator_answers(address, timeout=0.2)
        assert time.monotonic() - began < 2


def test_a_bad_setting_is_refused_before_torch_is_imported():
    result = subprocess.run([sys.executable, "-m", launch.COORDINATOR_MODULE, "--min-replicas", "0"],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2 and "must be at least 1" in result.stderr


@pytest.fixture
def coordinator(tmp_path):
    pytest.importorskip("torchft", reason="the coordinator runs torchft's Lighthouse (the train extra)")
    address_file = tmp_path / "address"
    proc = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-m", launch.COORDINATOR_MODULE,
         *launch.coordinator_args(launch.LOCAL, bind="127.0.0.1:0", min_nodes=1),
         f"--address-file={address_file}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not address_file.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the coordinator did not listen in time"
            time.sleep(0.1)
        yield proc, address_file.read_text().strip()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_it_forms_a_quorum_on_the_address_it_wrote_and_stops_cleanly_on_sigterm(coordinator):
    from torchft.coordination import LighthouseClient

    coordinator_answers = _probe()
    proc, address = coordinator
    assert address.startswith("http://127.0.0.1:")
    client = LighthouseClient(address, connect_timeout=timedelta(seconds=10))
    quorum = client.quorum(replica_id="job-node-0", timeout=timedelta(seconds=10), address="a", store_address="s",
                           step=0, world_size=1)
    assert [m.replica_id for m in quorum.participants] == ["job-node-0"]  # min nodes 1: it formed alone
    assert coordinator_answers(address, timeout=5)  # the nodes' probe before each step's quorum request
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert not coordinator_answers(address, timeout=5)  # its port refuses: at once
    assert f"coordinator listening on {address}" in out and "coordinator stopped" in out


def test_a_restarted_coordinator_that_a_node_greeted_waits_for_it_rather_than_forming_a_quorum_without_it():
    """A coordinator that restarts knows no node: the first to ask got a quorum alone. A node whose probe reaches it
    beats for itself at once (runtime/greeter.py), so the first to ask waits for it; after its stop, the beats end
    once its linger is over."""
    pytest.importorskip("torchft", reason="the coordinator runs torchft's Lighthouse (the train extra)")
    from torchft.coordination import LighthouseClient, LighthouseServer

    from azext_elastictrain.runtime.greeter import Greeter

    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=10_000, quorum_tick_ms=50,
                              heartbeat_timeout_ms=500)
    address = reachable_address("127.0.0.1:0", server.address())
    greeters = [Greeter(address, lambda name=name: name, linger=0.2) for name in ("node-0:a", "node-1:b")]
    try:
        for greeter in greeters:  # each node whose probe reached it (the torchft servers' own beats are not back)
            greeter.start()
        deadline = time.monotonic() + 10
        while min(greeter.beats for greeter in greeters) < 2:
            assert time.monotonic() < deadline, "the greeters never beat"
            time.sleep(0.05)
        quorums: dict[str, list[str]] = {}

        def ask(replica_id: str) -> None:
            client = LighthouseClient(address, connect_timeout=timedelta(seconds=5))
            quorum = client.quorum(replica_id=replica_id, timeout=timedelta(seconds=20), address="a",
                                   store_address="s", step=0, world_size=1)
            quorums[replica_id] = [m.replica_id for m in quorum.participants]

        first = threading.Thread(target=ask, args=("node-0:a",))
        first.start()
        time.sleep(0.5)
        assert not quorums, "the coordinator formed a quorum without the node it heard"
        ask("node-1:b")
        first.join(timeout=20)
        assert quorums == {"node-0:a": ["node-0:a", "node-1:b"], "node-1:b": ["node-0:a", "node-1:b"]}
        greeters[0].stop()
        deadline = time.monotonic() + 5
        while greeters[0].beating:
            assert time.monotonic() < deadline, "the greeter beat on past its linger"
            time.sleep(0.05)
        assert greeters[1].beating
    finally:
        for greeter in greeters:
            greeter.close()
        server.shutdown()


def test_a_node_reads_from_the_coordinator_whether_it_still_counts_it():
    """A departing node is ready to leave once the coordinator itself no longer counts it (runtime/handover.py): its
    status page, with torchft's real Lighthouse. Counted while its beats are fresh, not once they are older than
    the heartbeat timeout; a node never heard is not counted; no page: the coordinator cannot say."""
    pytest.importorskip("torchft", reason="the coordinator runs torchft's Lighthouse (the train extra)")
    from torchft.coordination import LighthouseClient, LighthouseServer

    from azext_elastictrain.runtime.replicas import coordinator_hears

    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=10_000, quorum_tick_ms=50,
                              heartbeat_timeout_ms=300)
    address = reachable_address("127.0.0.1:0", server.address())
    try:
        client = LighthouseClient(address, connect_timeout=timedelta(seconds=5))
        client.heartbeat("node-0:a", timeout=timedelta(seconds=5))
        client.heartbeat("node-1:b", timeout=timedelta(seconds=5))
        assert coordinator_hears(address, "node-0:a", timeout=2) is True
        assert coordinator_hears(address, "node-9:z", timeout=2) is False
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:  # node-1 beats on; node-0 has stopped
            client.heartbeat("node-1:b", timeout=timedelta(seconds=5))
            time.sleep(0.05)
        assert coordinator_hears(address, "node-0:a", timeout=2) is False
        assert coordinator_hears(address, "node-1:b", timeout=2) is True
    finally:
        server.shutdown()
    assert coordinator_hears(address, "node-1:b", timeout=0.5) is None
