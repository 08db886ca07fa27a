"""node_processes: a local node's processes are its agent's tree and, outside it, those carrying the node's
environment (a warm server a first launcher started, and the workers forked from it: runtime/warm.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from azext_elastictrain.backends.local.state import node_processes

SLEEP = "import time; time.sleep(60)"


def test_the_agents_tree_and_the_processes_with_the_nodes_environment_and_no_other():
    marker = f"node-{os.getpid()}"
    agent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); time.sleep(60)"])
    outside = subprocess.Popen([sys.executable, "-c", SLEEP], start_new_session=True,
                               env={**os.environ, "TEST_NODE": marker, "TEST_JOB": "j1"})
    other_job = subprocess.Popen([sys.executable, "-c", SLEEP], start_new_session=True,
                                 env={**os.environ, "TEST_NODE": marker, "TEST_JOB": "j2"})
    procs = [psutil.Process(p.pid) for p in (agent, outside, other_job)]
    try:
        deadline = time.monotonic() + 30
        while not procs[0].children() and time.monotonic() < deadline:
            time.sleep(0.05)
        (worker,) = procs[0].children()  # the agent's child: found through the tree, whatever its environment
        procs.append(worker)
        found = {p.pid for p in node_processes(agent.pid, {"TEST_NODE": marker, "TEST_JOB": "j1"})}
        assert found == {agent.pid, worker.pid, outside.pid}  # not the same node name in another job
    finally:
        for proc in procs:
            proc.kill()
        psutil.wait_procs(procs[3:], timeout=10)
        for popen in (agent, outside, other_job):
            popen.wait(timeout=10)
