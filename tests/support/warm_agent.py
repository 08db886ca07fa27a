"""Stands in for a torchrun agent in the warm-start tests: starts launchers as torchrun starts workers.

    python tests/support/warm_agent.py '<json list of launches>'

Each launch: {"script": path, "args": [...], "env": {...}, "parallel": n (default 1),
"signal": "SIGTERM" | "SIGKILL" (sent to the launcher's process group, as torchrun does, once the worker
wrote "ready" into "ready_file"), "stdin": text}. Launches run one after the other (each group of
``parallel`` at once) with their output captured through pipes, as torchrun's redirects or a tee would. Prints
one JSON line: [{"rc", "stdout", "stderr", "launcher_pid"}, ...] and exits, which ends the agent: the warm
server must go too.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

MODULE = "azext_elastictrain.runtime.warm"


def run(launch: dict) -> list[dict]:
    env = {**os.environ, **launch.get("env", {})}
    procs = [subprocess.Popen([sys.executable, "-m", MODULE, launch["script"], *launch.get("args", [])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              start_new_session=True, text=True)
             for _ in range(launch.get("parallel", 1))]
    for proc in procs:
        proc.stdin.write(launch.get("stdin", ""))
        proc.stdin.close()
        proc.stdin = None  # communicate() below only reads
    if "signal" in launch:
        ready = Path(launch["ready_file"])
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in procs:
            os.killpg(proc.pid, getattr(signal, launch["signal"]))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        results.append({"rc": proc.returncode, "stdout": out, "stderr": err, "launcher_pid": proc.pid})
    return results


def main() -> None:
    results = []
    for launch in json.loads(sys.argv[1]):
        results.extend(run(launch))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
