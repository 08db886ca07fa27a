"""A peer that vanishes (frozen: its sockets open, no FIN, as an Azure Spot VM evicted without notice) fails the
survivor's collectives within the job's collective timeout, on the runtime's own group and on a default group
created as the README's script creates it; two real gloo processes on loopback, one SIGSTOPped.

Bounded by a subprocess timeout far below torch's 30-minute default: with the groups at torch's default the
survivor would wait for the frozen peer until that bound and the test fails."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from azext_elastictrain.core import launch
from harness.services import free_port

TIMEOUT_SECONDS = 2  # the job's collective timeout, as the launch would set it
BOUND_SECONDS = 90  # the survivor must be done long before: start-up, the timeout, and the machine's load

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch
    import torch.distributed as dist
    from azext_elastictrain.runtime import collective_timeout
    from azext_elastictrain.runtime.collectives import Collectives

    dist.init_process_group("gloo", timeout=collective_timeout())  # as the README's script does
    ranks = Collectives()
    ranks.all_reduce_max([1])  # both ranks alive and talking
    print("READY", flush=True)
    if ranks.rank == 1:
        time.sleep(600)  # frozen by the test meanwhile
    while not os.path.exists(sys.argv[1]):  # the peer is frozen now
        time.sleep(0.05)
    try:
        if sys.argv[2] == "control":
            ranks.all_reduce_max([2])
        else:
            dist.all_reduce(torch.ones(1))  # DDP's gradient all-reduce runs on the default group
    except Exception as ex:  # noqa: BLE001  # the collective's failure is what this rank reports
        print(f"FAILED {type(ex).__name__}: {str(ex)[:300]}", flush=True)
        sys.exit(3)
    print("COMPLETED", flush=True)
""")


@pytest.mark.parametrize("group", ["control", "default"])
def test_a_frozen_peer_fails_the_survivors_collective_within_the_timeout(tmp_path, group):
    frozen_file = tmp_path / "frozen"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "GLOO_SOCKET_IFNAME": "lo", launch.ENV_COLLECTIVE_TIMEOUT: str(TIMEOUT_SECONDS)}
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(frozen_file), group],  # noqa: S603
                              env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in range(2)]
    survivor, peer = procs
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "READY", proc.stdout.read()
        os.kill(peer.pid, signal.SIGSTOP)
        time.sleep(0.5)
        frozen_file.touch()
        try:
            out, _ = survivor.communicate(timeout=BOUND_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the survivor still waited for the frozen peer after {BOUND_SECONDS}s "
                        f"(its {group} group has no collective timeout)")
        # the collective raised (the process may then die of gloo's teardown with a frozen peer: still a failure)
        assert "FAILED" in out and "COMPLETED" not in out and survivor.returncode != 0, out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()


def test_the_launch_sets_the_collective_timeout_the_runtime_reads():
    from datetime import timedelta

    from azext_elastictrain.core.spec import job_env
    from azext_elastictrain.core.spec import JobSpec
    from azext_elastictrain.runtime import collective_timeout

    for profile in (launch.LOCAL, launch.AKS):
        env = job_env(JobSpec(name="job", script="train.py"), profile)
        assert collective_timeout(env) == timedelta(seconds=profile.collective_timeout_seconds)
    assert collective_timeout({}) == timedelta(seconds=launch.DEFAULT_COLLECTIVE_TIMEOUT_SECONDS)
    assert collective_timeout({launch.ENV_COLLECTIVE_TIMEOUT: "7.5"}) == timedelta(seconds=7.5)
    for bad in ("0", "-3", "ten", "nan", "inf"):
        with pytest.raises(ValueError, match=launch.ENV_COLLECTIVE_TIMEOUT):
            collective_timeout({launch.ENV_COLLECTIVE_TIMEOUT: bad})
