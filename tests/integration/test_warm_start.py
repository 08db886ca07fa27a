"""Warm worker starts (runtime/warm.py): a worker forked from the node's warm server is the process torchrun
would have started (argv, environment, cwd, streams, exit status, signals, fresh random seeds), only started
without importing torch again; anything unsafe or unavailable starts it cold instead.

A small agent (tests/support/warm_agent.py) stands in for torchrun: it starts the launchers the way torchrun
starts workers (own session, pipes, killpg) and exits, and its warm server must go with it. The real torchrun
path runs in every local job test (backends/local starts each node's workers through the launcher).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from azext_elastictrain.core import launch
from azext_elastictrain.runtime import warm

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "tests" / "support" / "warm_agent.py"

PROBE = '''
import json, os, random, signal, sys, time
preloaded = "torch" in sys.modules
import numpy, torch
info = {"preloaded": preloaded, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
        "x": os.environ.get("PROBE_X"), "rank": os.environ.get("RANK"), "pid": os.getpid(), "ppid": os.getppid(),
        "sid": os.getsid(0), "stdin": sys.stdin.read(), "random": random.random(), "torch": torch.rand(1).item(),
        "numpy": float(numpy.random.rand())}
print(json.dumps(info), flush=True)
print("to stderr", file=sys.stderr)
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "raise":
    raise RuntimeError("boom from the script")
if mode == "self-kill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode in ("term", "wait"):
    if mode == "term":
        signal.signal(signal.SIGTERM, lambda *_: (print("got SIGTERM", flush=True), sys.exit(7)))
    with open(sys.argv[2] + ".tmp", "w") as ready:  # whole or absent: the agent signals once the file exists
        ready.write(str(os.getpid()))
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    time.sleep(60)
'''


@pytest.fixture
def probe(tmp_path):
    path = tmp_path / "scripts" / "probe.py"
    path.parent.mkdir()
    path.write_text(PROBE)
    return path


@pytest.fixture
def warm_dir():
    """A short folder: a Unix socket's path has 107 bytes at most, and pytest's tmp_path can be longer."""
    folder = Path(tempfile.mkdtemp(prefix="warm-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def run_agent(launches: list[dict], warm_dir: Path, cwd: Path, **env) -> list[dict]:
    full_env = {**os.environ, warm.ENV_WARM_DIR: str(warm_dir), "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **env}
    full_env.pop(warm.ENV_WARM_START, None)
    full_env.update(env)
    done = subprocess.run([sys.executable, str(AGENT), json.dumps(launches)], capture_output=True, text=True,
                          cwd=cwd, env=full_env, timeout=240, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def info(result: dict) -> dict:
    return json.loads(result["stdout"].splitlines()[0])


def servers(warm_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "--serve" in cmdline and any(str(warm_dir) in part for part in cmdline):
            found.append(proc)
    return found


def wait_gone(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not check():
            return True
        time.sleep(0.1)
    return False


def test_a_warm_worker_is_the_process_a_cold_start_would_be(probe, warm_dir, tmp_path):
    launch = {"script": str(probe), "env": {"PROBE_X": "x1", "RANK": "3"}, "stdin": "from the agent"}
    warm1, warm2 = run_agent([launch, dict(launch, env={"PROBE_X": "x2", "RANK": "5"})], warm_dir, tmp_path)
    (cold,) = run_agent([launch], warm_dir, tmp_path, **{warm.ENV_WARM_START: "off"})
    w1, w2, c = info(warm1), info(warm2), info(cold)

    assert c["preloaded"] is False and w1["preloaded"] is True and w2["preloaded"] is True, warm1["stderr"]
    for key in ("argv", "cwd", "path0", "name", "x", "rank", "stdin"):
        assert w1[key] == c[key], key
    assert w1["path0"] == str(probe.parent) and w1["name"] == "__main__" and w1["stdin"] == "from the agent"
    assert (w2["x"], w2["rank"]) == ("x2", "5")  # each worker its own launcher's environment
    # Forked from one server (its parent), each in a session of its own, each seeded afresh as a new process is.
    assert w1["ppid"] == w2["ppid"] != warm1["launcher_pid"] and w1["sid"] == w1["pid"]
    for key in ("random", "torch", "numpy"):
        assert w1[key] != w2[key], key
    assert warm1["stderr"].strip() == cold["stderr"].strip() == "to stderr"
    assert warm1["rc"] == warm2["rc"] == cold["rc"] == 0


def test_the_launcher_ends_as_its_worker_did(probe, warm_dir, tmp_path):
    results = run_agent([{"script": str(probe), "args": ["exit", "3"]},
                         {"script": str(probe), "args": ["raise"]},
                         {"script": str(probe), "args": ["self-kill"]}], warm_dir, tmp_path)
    assert [r["rc"] for r in results] == [3, 1, -9]
    assert all(info(r)["preloaded"] for r in results)
    # Python's report of the script's error, from the script's frame: no frame of the launcher or runpy.
    traceback = results[1]["stderr"]
    assert "RuntimeError: boom from the script" in traceback
    assert "runpy" not in traceback and "warm.py" not in traceback
    assert f'File "{probe}", line' in traceback


def test_torchruns_sigterm_reaches_the_worker_and_its_exit_code_comes_back(probe, warm_dir, tmp_path):
    ready = tmp_path / "ready"
    (result,) = run_agent([{"script": str(probe), "args": ["term", str(ready)], "signal": "SIGTERM",
                            "ready_file": str(ready)}], warm_dir, tmp_path)
    assert info(result)["preloaded"] is True
    assert "got SIGTERM" in result["stdout"] and result["rc"] == 7


def test_a_worker_whose_launcher_is_killed_dies_with_it(probe, warm_dir, tmp_path):
    ready = tmp_path / "ready"
    (result,) = run_agent([{"script": str(probe), "args": ["wait", str(ready)], "signal": "SIGKILL",
                            "ready_file": str(ready)}], warm_dir, tmp_path)
    assert result["rc"] == -9
    worker = int(ready.read_text())
    assert info(result)["preloaded"] is True  # it was a forked worker, not the launcher itself
    assert wait_gone(lambda: psutil.pid_exists(worker) and psutil.Process(worker).status() != psutil.STATUS_ZOMBIE)


def test_the_server_serves_parallel_workers_once_and_goes_with_its_agent(probe, warm_dir, tmp_path):
    ready = tmp_path / "ready"
    results = run_agent([{"script": str(probe), "parallel": 2},
                         {"script": str(probe), "args": ["wait", str(ready)], "signal": "SIGTERM",
                          "ready_file": str(ready)}], warm_dir, tmp_path)
    parents = {info(r)["ppid"] for r in results}
    assert len(parents) == 1 and all(info(r)["preloaded"] for r in results)  # one server for the node
    assert results[2]["rc"] == -15  # no handler: the worker died of the SIGTERM, and so does its launcher
    (server,) = parents
    assert wait_gone(lambda: psutil.pid_exists(server) and psutil.Process(server).status() != psutil.STATUS_ZOMBIE)
    assert not servers(warm_dir) and list(warm_dir.iterdir()) == []  # socket and lock removed


def test_a_folder_others_could_write_is_not_used_and_the_worker_starts_cold(probe, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (result,) = run_agent([{"script": str(probe), "env": {"PROBE_X": "cold"}}], shared, tmp_path)
    assert result["rc"] == 0 and info(result)["preloaded"] is False and info(result)["x"] == "cold"
    assert "warm start unavailable" in result["stderr"] and "not a folder of this user's alone" in result["stderr"]
    assert list(shared.iterdir()) == []


def test_a_socket_path_too_long_for_unix_sockets_starts_the_worker_cold(probe, tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True, mode=0o700)
    deep.chmod(0o700)
    (result,) = run_agent([{"script": str(probe)}], deep, tmp_path)
    assert result["rc"] == 0 and info(result)["preloaded"] is False
    assert "longer than a Unix socket's 107 bytes" in result["stderr"]


def test_an_import_that_starts_a_thread_makes_the_server_refuse_and_the_worker_start_cold(probe, warm_dir, tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    pythonpath = os.pathsep.join([str(lib), str(REPO), os.environ.get("PYTHONPATH", "")])
    (result,) = run_agent([{"script": str(probe)}], warm_dir, tmp_path, PYTHONPATH=pythonpath,
                          **{warm.ENV_WARM_IMPORTS: "starts_a_thread"})
    assert result["rc"] == 0 and info(result)["preloaded"] is False
    assert "started a Python thread" in result["stderr"] and "starting" in result["stderr"]


def test_the_server_imports_installed_modules_not_the_scripts_neighbours(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    (tmp_path / "neighbour.py").write_text("import os\nRANK = os.environ['RANK']\n")
    script.write_text("from __future__ import annotations\nimport json, neighbour\nfrom . import x\n"
                      "from numpy import linalg\nimport not_a_module_anywhere\n"
                      "try:\n    import wave\nexcept ImportError:\n    wave = None\n"
                      "def f():\n    import sklearn\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(warm.ENV_WARM_IMPORTS, "decimal, csv")
    names = warm.warm_imports(str(script))
    assert names[:len(warm.BASE_IMPORTS)] == list(warm.BASE_IMPORTS)
    assert {"decimal", "csv", "json", "numpy", "wave"} <= set(names)  # wave: an optional import in a try
    # Beside the script (may read the round's settings), relative, unknown, or not at the top: not imported.
    assert not {"neighbour", "not_a_module_anywhere", "sklearn", "__future__", "x"} & set(names)


def test_usage_without_a_script_is_an_error_not_a_traceback():
    done = subprocess.run([sys.executable, "-m", warm.MODULE], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1 and "usage: python -m azext_elastictrain.runtime.warm SCRIPT" in done.stderr
    assert "Traceback" not in done.stderr


TORCHRUN_PROBE = '''
import json, os, sys
preloaded = "torch" in sys.modules
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
out = os.path.join(os.environ["PROBE_OUT"], f"attempt{attempt}-rank{dist.get_rank()}.json")
server_parent = int(open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1])
open(out, "w").write(json.dumps({"preloaded": preloaded, "pid": os.getpid(), "ppid": os.getppid(),
                                  "server_parent": server_parent,
                                  "sum": t.item(), "world": dist.get_world_size()}))
dist.destroy_process_group()
sys.exit(1 if attempt == 0 else 0)  # the first attempt fails: torchrun restarts the workers
'''


def test_real_torchrun_behind_the_agent_wrapper_starts_every_worker_warm_restarts_included(tmp_path, warm_dir):
    """`--agent` starts the node's server and becomes torchrun (same pid): the first workers are warm too, a
    failed attempt's restart is warm, the server is the agent's child, and it goes when the agent ends."""
    script = tmp_path / "probe.py"
    script.write_text(TORCHRUN_PROBE)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, warm.ENV_WARM_DIR: str(warm_dir), "PROBE_OUT": str(out), "OMP_NUM_THREADS": "1",
           "GLOO_SOCKET_IFNAME": "lo", **launch.TCP_STORE_WORKAROUND,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop(warm.ENV_WARM_START, None)
    agent = subprocess.Popen(
        [sys.executable, *launch.agent_module(), "--standalone", "--nnodes=1", "--nproc-per-node=2",
         "--max-restarts=1", "--monitor-interval=0.2", *launch.worker_entry(str(script))],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = agent.communicate(timeout=240)
    finally:
        agent.kill()
    assert agent.returncode == 0, output[-3000:]
    runs = {p.stem: json.loads(p.read_text()) for p in out.iterdir()}
    assert sorted(runs) == ["attempt0-rank0", "attempt0-rank1", "attempt1-rank0", "attempt1-rank1"], output[-3000:]
    assert all(r["preloaded"] and r["world"] == 2 and r["sum"] == 3.0 for r in runs.values())
    (server,) = {r["ppid"] for r in runs.values()}  # one server forked all four
    assert {r["server_parent"] for r in runs.values()} == {agent.pid}  # the agent's child: in the node's tree
    assert len({r["pid"] for r in runs.values()}) == 4
    assert "starting" not in output  # no worker fell back to a cold start
    assert wait_gone(lambda: psutil.pid_exists(server) and psutil.Process(server).status() != psutil.STATUS_ZOMBIE)
    assert list(warm_dir.iterdir()) == []
