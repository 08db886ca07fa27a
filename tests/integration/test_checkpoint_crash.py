"""Crash consistency: a training process SIGKILLed at any moment of a save never leaves
a checkpoint that restores partially or wrongly, and restore always finds the newest
committed one.

A child process saves a ~10 MiB state in a loop (steps n, n+1, ...; the state is a
deterministic function of the step). The parent kills it with SIGKILL after a random
delay drawn over the duration of a save (measured once up front), so kills land in
every phase: snapshot, block uploads, ``.metadata``, the manifest, retention. After
every kill the parent restores and checks the result against the listing and against
a recomputation of the state of that step. The next child resumes from there, in the
same job, as a restarted training would.

Set ELASTICTRAIN_CRASH_SEED to replay a run (the seed is printed).
"""
from __future__ import annotations

import collections
import inspect
import os
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from azext_elastictrain.core import catalog, layout
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime.checkpoint import Checkpointer
from harness import services as svc

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

JOB = "crashjob"
KILLS = 50
KEEP = 2
SEED = int(os.environ.get("ELASTICTRAIN_CRASH_SEED", "20240917"))
LINE_TIMEOUT_S = 60.0


def make_state(step: int) -> dict:
    """The training state at ``step``: ~10 MiB, a pure function of the step."""
    g = torch.Generator().manual_seed(1_000_003 * step + 17)
    return {
        "model": {
            "w1": torch.randn(1024, 1024, generator=g),
            "w2": torch.randn(1536, 1024, generator=g),
            "b": torch.randint(-(2**31), 2**31 - 1, (4099,), generator=g, dtype=torch.int64),
        },
        "meta": {"step": step, "tag": f"state-of-{step}"},
    }


def template() -> dict:
    return {
        "model": {
            "w1": torch.zeros(1024, 1024),
            "w2": torch.zeros(1536, 1024),
            "b": torch.zeros(4099, dtype=torch.int64),
        },
        "meta": {"step": -1, "tag": ""},
    }


# The child is a zygote: it imports torch and the runtime once, then forks one saver
# per trial, so a trial costs a fork instead of an interpreter start. Each saver is
# an ordinary process with its own connections; the test SIGKILLs it by pid.
CHILD = (
    textwrap.dedent(
        """
        import ctypes, os, signal, sys, time
        import torch
        from azext_elastictrain.runtime.checkpoint import Checkpointer

        def say(*words):
            # one write(2) per line: a saver killed mid-line must not glue its words to the next line
            os.write(1, (" ".join(map(str, words)) + "\\n").encode())

        def die_with_parent():
            try:
                ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            except (OSError, AttributeError):
                pass

        """
    )
    + textwrap.dedent(inspect.getsource(make_state))
    + textwrap.dedent(
        """
        def saver(start, mode):
            die_with_parent()
            say("pid", os.getpid())
            ckpt = Checkpointer.from_env(keep=int(os.environ["KEEP"]), watcher=None)
            step = start
            while True:
                state = make_state(step)
                say("begin", step)
                ckpt.save(step, state, blocking=(mode == "blocking"))
                say("saved", step)
                step += 1

        say("ready")
        for line in sys.stdin:
            _, start, mode = line.split()
            pid = os.fork()
            if pid == 0:
                try:
                    saver(int(start), mode)
                finally:
                    os._exit(1)
            _, status = os.waitpid(pid, 0)
            say("exited", pid, status)
        """
    )
)


class Zygote:
    """The forking child process; its (and its savers') stdout lines arrive on a queue."""

    def __init__(self, script: Path, env: dict, log: Path):
        self.log = log
        self._log_file = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            env=env,
            cwd=str(script.parent),
            start_new_session=True,
            preexec_fn=svc._DIE_WITH_PARENT,
        )
        self.lines: queue.Queue = queue.Queue()
        self.history: collections.deque = collections.deque(maxlen=30)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.expect("ready")

    def _read(self) -> None:
        for raw in self.proc.stdout:
            self.history.append(raw)
            line = raw.decode().strip()
            cut = line.find("exited ")
            if cut > 0:  # the rest of a line cut short by SIGKILL, then the zygote's report
                self.lines.put(line[:cut])
                line = line[cut:]
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, prefix: str) -> str:
        deadline = time.monotonic() + LINE_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} from the child within {LINE_TIMEOUT_S}s\n{self.stderr()}") from None
            if line is None:
                raise AssertionError(f"child exited ({self.proc.wait()}) before {prefix!r}\n{self.stderr()}")
            if line.startswith("exited") and not prefix.startswith("exited"):
                raise AssertionError(f"saver {line} by itself while waiting for {prefix!r}\n{self.stderr()}")
            if line.split()[: len(prefix.split())] == prefix.split():  # whole words: "begin 3" is not "begin 34"
                return line

    def start_saver(self, start: int, mode: str) -> int:
        self.proc.stdin.write(f"go {start} {mode}\n".encode())
        self.proc.stdin.flush()
        return int(self.expect("pid").split()[1])

    def kill_saver(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        try:
            line = self.expect(f"exited {pid}")
        except AssertionError as ex:
            raise AssertionError(
                f"{ex}\n{_proc_state(pid)}\n{_proc_state(self.proc.pid)}\nlast lines: {list(self.history)}"
            ) from None
        status = int(line.split()[2])
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # its saver, if any, follows (PR_SET_PDEATHSIG)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self._log_file.close()

    def stderr(self) -> str:
        self._log_file.flush()
        return self.log.read_bytes()[-4000:].decode(errors="replace")


def _proc_state(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        state = next(line for line in status.splitlines() if line.startswith("State"))
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        return f"pid {pid}: {state} wchan={wchan}"
    except OSError as ex:
        return f"pid {pid}: {ex}"


def manifest_steps(store: BlobStore) -> list[int]:
    names = [e.name for e in store.list(layout.checkpoints_prefix(JOB))]
    return sorted(
        layout.parse_step(n, JOB) for n in names if n.endswith("/" + layout.MANIFEST)
    )


def settled_manifest_steps(store: BlobStore) -> list[int]:
    """The committed steps, once requests the dead child had in flight are done."""
    previous = manifest_steps(store)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.1)
        current = manifest_steps(store)
        if current == previous:
            return current
        previous = current
    raise AssertionError("the listing kept changing after the writer was killed")


def assert_state_of_step(state: dict, step: int) -> None:
    expected = make_state(step)
    for key in ("w1", "w2", "b"):
        assert torch.equal(state["model"][key], expected["model"][key]), f"{key} differs from step {step}'s"
    assert state["meta"] == expected["meta"]


@pytest.mark.slow  # ~60 s: 50 SIGKILLs, each followed by a verified restore
def test_sigkill_at_any_moment_of_a_save_never_yields_a_partial_or_stale_restore(
    azurite: svc.AzuriteService, container_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ELASTICTRAIN_SCHEDULED_EVENTS_URL", "off")
    rng = random.Random(SEED)
    print(f"\ncrash test: seed {SEED} (set ELASTICTRAIN_CRASH_SEED to replay), {KILLS} kills")
    url = f"{container_url}/{JOB}"
    script = tmp_path / "saver.py"
    script.write_text(CHILD)
    env = dict(
        os.environ,
        ELASTICTRAIN_CHECKPOINT_URL=url,
        AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string,
        ELASTICTRAIN_SCHEDULED_EVENTS_URL="off",
        KEEP=str(KEEP),
        PYTHONPATH=os.pathsep.join(p for p in (str(svc.REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
    )
    store = BlobStore.from_url(url, connection_string=azurite.connection_string)
    reader = Checkpointer(store, keep=KEEP, watcher=None, events=False)
    zygote = Zygote(script, env, tmp_path / "zygote.log")
    try:
        # Calibrate: a saver writes steps 1..4 undisturbed (blocking); time each save.
        pid = zygote.start_saver(1, "blocking")
        zygote.expect("begin 1")
        began = time.monotonic()
        durations = []
        for step in (2, 3, 4):
            zygote.expect(f"begin {step}")
            now = time.monotonic()
            durations.append(now - began)
            began = now
        zygote.kill_saver(pid)
        first_save, steady_save = durations[0], min(durations[1:])
        print(f"crash test: first save {first_save:.3f}s, later saves {steady_save:.3f}s")
        assert manifest_steps(store)[-1] >= 3

        restored = reader.restore(target := template())
        assert restored is not None
        assert_state_of_step(target, restored)

        phases: dict[str, int] = {}
        for kill in range(KILLS):
            start = restored + 1
            mode = rng.choice(["blocking", "async"])
            extra_saves = rng.choice([0, 0, 0, 1, 2])
            delay = rng.uniform(0, 1.15 * first_save) + extra_saves * steady_save
            before = manifest_steps(store)
            pid = zygote.start_saver(start, mode)
            zygote.expect(f"begin {start}")
            time.sleep(delay)
            zygote.kill_saver(pid)

            committed = settled_manifest_steps(store)
            newest = committed[-1] if committed else None
            target = template()
            restored = reader.restore(target)
            after = manifest_steps(store)
            context = (f"kill {kill} (seed {SEED}): mode={mode} start={start} delay={delay:.3f}s "
                       f"manifests before={before} at kill={committed} after={after}")

            # the newest committed checkpoint, and exactly what was saved at that step
            assert after == committed, context
            assert restored == newest, f"restored {restored}, newest committed {newest}; {context}"
            assert_state_of_step(target, restored)
            # every checkpoint that has a manifest is whole: retention un-commits before it deletes
            listed = catalog.list_checkpoints(store, JOB)
            damaged = [(c.step, c.problems) for c in listed if c.status == catalog.DAMAGED]
            assert not damaged, f"{damaged}; {context}"
            assert [c.step for c in listed if c.complete] == committed, context

            # where the kill landed, judged by the newest step folder this saver touched
            touched = [c for c in listed if c.step >= start]
            if not touched:
                phase = "no file committed yet"  # snapshot, planning, block uploads
            elif touched[-1].complete:
                phase = "after a commit"  # retention, or the next step's snapshot/blocks
            else:
                phase = "files committed, no manifest"  # .metadata, manifest
            phases[phase] = phases.get(phase, 0) + 1
        print(f"crash test: kills by phase {phases}")
        # the kills landed before and after commits, not all on one side
        assert phases.get("no file committed yet", 0) > 0 and phases.get("after a commit", 0) > 0, phases

        # An undisturbed save afterwards commits, and retention trims the job to the newest KEEP.
        start = restored + 1
        pid = zygote.start_saver(start, "blocking")
        zygote.expect(f"saved {start}")
        zygote.kill_saver(pid)
        listed = catalog.list_checkpoints(store, JOB)
        assert [c.step for c in listed if c.complete] == [start - 1, start]
        assert reader.restore(target := template()) == start
        assert_state_of_step(target, start)
    finally:
        zygote.close()
        reader.close()
        store.close()
