"""Job specs, what a job's events say, the job table formatters and the job commands' help (pure)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from azext_elastictrain import _format
from azext_elastictrain.core.eventlog import events
from azext_elastictrain.core.spec import JobSpec, LocalClusterSpec, SpecError, check_local_script

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO_ROOT / "scripts" / "train_cifar10.py")


def spec(**changes) -> JobSpec:
    fields = dict(name="cifar", script=SCRIPT, min_nodes=1, max_nodes=2)
    fields.update(changes)
    return JobSpec(**fields)


def local_job(**changes) -> JobSpec:
    """A job of the local cluster: its script is a file here."""
    built = spec(**changes)
    check_local_script(built.script)
    return built


# --------------------------------------------------------------------------- JobSpec


def test_a_valid_spec_starts_max_nodes_by_default_named_after_the_job() -> None:
    s = spec()
    assert s.node_count == 2 and s.node_names() == ["cifar-node-0", "cifar-node-1"]
    assert spec(nodes=1).node_names() == ["cifar-node-0"]
    assert s.nproc_per_node == 1 and s.keep == 3 and s.checkpoint_interval is None


@pytest.mark.parametrize("changes", [
    dict(min_nodes=1, max_nodes=1),
    dict(min_nodes=2, max_nodes=4, nodes=2),
    dict(min_nodes=2, max_nodes=4, nodes=4),
    dict(nproc_per_node=8, checkpoint_interval=1, keep=1),
    dict(name="a"), dict(name="a" * 63), dict(name="job-2"),
])
def test_valid_specs(changes) -> None:
    assert local_job(**changes) == JobSpec(**{"name": "cifar", "script": SCRIPT, "min_nodes": 1, "max_nodes": 2,
                                              **changes})


@pytest.mark.parametrize("changes, message", [
    (dict(min_nodes=3, max_nodes=2), "--min-nodes 3 is more than --max-nodes 2"),
    (dict(min_nodes=2, max_nodes=4, nodes=1), "--nodes 1 is outside"),
    (dict(min_nodes=2, max_nodes=4, nodes=5), "--nodes 5 is outside"),
    (dict(min_nodes=0), "--min-nodes must be a whole number of at least 1"),
    (dict(min_nodes=-1, max_nodes=-1), "--min-nodes must be"),
    (dict(max_nodes=0, min_nodes=0), "--min-nodes must be"),
    (dict(nodes=0), "--nodes must be"),
    (dict(nproc_per_node=0), "--nproc-per-node must be"),
    (dict(checkpoint_interval=0), "--checkpoint-interval must be"),
    (dict(keep=0), "--keep must be"),
    (dict(min_nodes=True), "--min-nodes must be"),
    (dict(min_nodes="2"), "--min-nodes must be"),
    (dict(name="Bad_Name"), "invalid job name"),
    (dict(name="-x"), "invalid job name"),
    (dict(name="a" * 64), "invalid job name"),
    (dict(name="../etc"), "invalid job name"),
    (dict(name="job\n"), "invalid job name"),
    (dict(name=""), "invalid job name"),
    (dict(script="/nonexistent/train.py"), "is not a file"),
    (dict(script=str(REPO_ROOT / "scripts")), "is not a file"),
    (dict(script=""), "no training script"),
])
def test_invalid_specs_say_what_is_wrong(changes, message) -> None:
    with pytest.raises(SpecError) as info:
        local_job(**changes)
    assert message in str(info.value)


def test_a_bad_local_cluster_name_is_refused_as_the_spec_is_built() -> None:
    with pytest.raises(SpecError, match="invalid local cluster name"):
        LocalClusterSpec("Bad/Cluster")


def test_the_recovery_mode_defaults_to_restart_and_is_checked_when_the_spec_is_made() -> None:
    assert spec().recovery == "restart" and not spec().in_process
    assert spec(recovery="in-process").in_process
    with pytest.raises(SpecError, match="unknown recovery mode 'inprocess': use restart or in-process"):
        spec(recovery="inprocess")  # refused as it is made


def test_job_run_without_recovery_gets_in_process_locally_and_restart_on_aks() -> None:
    """A mode is the default only while it passes the battery of users' scripts: both do; locally in-process, the
    faster; AKS keeps restart (a vanish there would cost its 30 s replica timeout in process, unmeasured)."""
    from azext_elastictrain._validators import Target
    from azext_elastictrain.operations.job import _job_spec

    def made(kind: str, recovery: str | None) -> str:
        return _job_spec(Target(kind, "c", "rg" if kind == "aks" else None), script_args=None, gpus_per_node=None,
                         nproc_per_node=None, memory_tier=None, recovery=recovery, name="j", script="train.py",
                         min_nodes=1, max_nodes=2).recovery

    assert made("local", None) == "in-process" and made("aks", None) == "restart"
    assert made("local", "restart") == "restart" and made("aks", "in-process") == "in-process"


def test_name_is_checked_before_the_file_system() -> None:
    with pytest.raises(SpecError, match="invalid job name"):
        local_job(name="BAD", script="/nonexistent")


# --------------------------------------------------------------------------- events


def _ev(kind: str, t: float, **fields) -> dict:
    return {"time": t, "event": kind, "rank": 0, "node": "n0", **fields}


RUN = [
    _ev("started", 100.0, world_size=2, restart_count=0),
    _ev("restored", 100.5, step=None, world_size=2),
    _ev("progress", 102.0, step=10, world_size=2, samples_per_s=900.0, metrics={"loss": 1.5}),
    _ev("checkpoint", 103.0, step=25, bytes=10, seconds=0.1),
    _ev("progress", 104.0, step=30, world_size=2, samples_per_s=880.0, metrics={"loss": 0.5}),
    _ev("preempted", 104.5, step=31, source="scheduled-events", event_id="e1", node="n1"),
    _ev("checkpoint", 104.7, step=31, bytes=10, seconds=0.1),
    _ev("started", 110.0, world_size=1, restart_count=1),
    _ev("restored", 110.5, step=31, world_size=1, saved_world_size=2),
    _ev("progress", 112.0, step=40, world_size=1, samples_per_s=450.0, metrics={"loss": 0.25}),
    _ev("checkpoint_failed", 112.5, step=50, error="x"),
]


def test_summary_of_a_run_that_lost_a_node_and_recovered() -> None:
    s = events.summarize(RUN)
    assert s["step"] == 40 and s["worldSize"] == 1 and s["samplesPerSecond"] == 450.0 and s["loss"] == 0.25
    assert s["lastCheckpointStep"] == 31 and s["lastCheckpointTime"] == 104.7
    assert s["preempted"] == [{"node": "n1", "step": 31, "source": "scheduled-events"}]
    assert s["recoveries"] == 1 and s["workerRestarts"] == 1 and s["failedCheckpoints"] == 1
    assert s["started"] and not s["finished"]


def test_step_follows_a_restore_back_to_an_earlier_step() -> None:
    s = events.summarize(RUN[:5] + [_ev("restored", 106.0, step=25, world_size=1)])
    assert s["step"] == 25 and s["worldSize"] == 1 and s["recoveries"] == 1


def test_a_restore_forgets_the_rate_of_the_old_world_size() -> None:
    s = events.summarize(RUN[:5] + [_ev("restored", 106.0, step=25, world_size=1)])
    assert s["samplesPerSecond"] is None
    s = events.summarize(RUN)  # ... until the re-formed job reports its own
    assert s["samplesPerSecond"] == 450.0


def test_capacity_coming_back_is_a_scale_up_not_a_recovery() -> None:
    back = [_ev("started", 114.0, world_size=2, restart_count=2),
            _ev("restored", 114.5, step=40, world_size=2, saved_world_size=1),
            _ev("progress", 116.0, step=50, world_size=2)]
    s = events.summarize(RUN + back)
    assert s["recoveries"] == 1 and s["scaleUps"] == 1 and s["worldSize"] == 2


def test_finished_gives_the_final_step() -> None:
    s = events.summarize(RUN + [_ev("checkpoint", 120.0, step=150), _ev("finished", 120.1, step=150)])
    assert s["finished"] and s["step"] == 150 and s["lastCheckpointStep"] == 150


def test_no_events_say_nothing() -> None:
    s = events.summarize([])
    assert not s["started"] and not s["finished"]
    assert s["step"] is None and s["worldSize"] is None and s["lastCheckpointStep"] is None
    assert s["recoveries"] == 0 and s["preempted"] == []


def test_events_of_an_earlier_run_of_the_same_name_are_left_out() -> None:
    old = [_ev("finished", 50.0, step=150)]
    assert events.since(old + RUN, start_time=100.0) == RUN
    assert events.since([{"event": "progress"}], 0) == []  # no time: not ours to judge


def test_parse_events_skips_torn_and_foreign_lines() -> None:
    data = b'{"event":"started","time":1}\n{"event":"prog\n[1,2]\n\n{"event":"finished","time":2}\n'
    assert [e["event"] for e in events.parse_events(data)] == ["started", "finished"]


@pytest.mark.parametrize("finished, alive, stop, state", [
    (False, True, False, "Running"),
    (True, True, False, "Succeeded"),
    (True, False, False, "Succeeded"),
    (False, False, False, "Failed"),
    (False, False, True, "Stopped"),
    (True, False, True, "Succeeded"),
])
def test_job_state(finished, alive, stop, state) -> None:
    assert events.job_state(finished, alive, stop) == state


def test_finished_counts_only_when_no_world_trains_after_it_and_its_total_is_reached() -> None:
    """Success is the planned work done by the last world: a `finished` event followed by a world that trains
    (an older runtime's done() after a stop) or short of its total says nothing about the end."""
    first = [_ev("started", 1.0, world_size=2), _ev("restored", 2.0, step=None, world_size=2),
             _ev("progress", 3.0, step=57, world_size=2)]
    early = first + [_ev("finished", 4.0, step=57)]
    assert events.summarize(early)["finished"]  # nothing trained after it (yet): the old meaning stands
    later = early + [_ev("started", 6.0, world_size=2), _ev("restored", 7.0, step=57, world_size=2)]
    assert not events.summarize(later)["finished"]
    assert not events.summarize(later + [_ev("progress", 8.0, step=90, world_size=2)])["finished"]
    end = later + [_ev("checkpoint", 9.0, step=258), _ev("finished", 10.0, step=258, total=258)]
    assert events.summarize(end)["finished"] and events.summarize(end)["step"] == 258
    assert not events.summarize(first + [_ev("finished", 4.0, step=57, total=258)])["finished"]


def test_runtime_progress_re_exports_the_core_events() -> None:
    import ast

    source = (REPO_ROOT / "azext_elastictrain" / "runtime" / "progress.py").read_text()
    tree = ast.parse(source)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module == "azext_elastictrain.core.eventlog.events" for a in n.names}
    assert {"read_events", "STARTED", "FINISHED", "PROGRESS", "CHECKPOINT", "PREEMPTED", "RESTORED"} <= imported
    assert "def read_events" not in source


# --------------------------------------------------------------------------- tables

SHOWN = {
    "name": "cifar", "state": "Running", "minNodes": 1, "maxNodes": 2, "recovery": "in-process", "worldSize": 2,
    "step": 40,
    "samplesPerSecond": 880.123, "lastCheckpointStep": 25, "evictions": 1, "recoveries": 1, "goodput": 0.93456,
    "created": "2026-01-01T00:00:00Z",
    "nodes": [{"name": "cifar-node-0", "alive": True}, {"name": "cifar-node-1", "alive": False}],
}


def test_job_table_row_is_ordered_and_readable() -> None:
    row = _format.job_row(SHOWN)
    assert list(row) == ["Name", "State", "Nodes", "MinMax", "Recovery", "WorldSize", "Step", "SamplesPerSec",
                         "LastCheckpoint", "Evictions", "Recoveries", "Goodput", "Created"]
    assert list(row.values()) == ["cifar", "Running", "1/2", "1-2", "in-process", 2, 40, "880.1", 25, 1, 1,
                                  "93.5%", "2026-01-01T00:00:00Z"]
    assert _format.job_show_table(SHOWN) == [row]
    assert _format.job_list_table([SHOWN, SHOWN]) == [row, row]


def test_job_table_row_before_the_first_event_has_blanks_not_none() -> None:
    row = _format.job_row(dict(SHOWN, worldSize=None, step=None, samplesPerSecond=None, lastCheckpointStep=None,
                               goodput=None))
    assert (row["WorldSize"], row["Step"], row["SamplesPerSec"], row["LastCheckpoint"], row["Goodput"]) == \
        ("", "", "", "", "")


def test_a_step_zero_checkpoint_shows_as_zero() -> None:
    assert _format.job_row(dict(SHOWN, lastCheckpointStep=0, step=0))["LastCheckpoint"] == 0


def test_job_delete_table() -> None:
    rows = _format.job_delete_table({"name": "cifar", "dryRun": True, "checkpoints": "kept",
                                     "stopped": [{"node": "cifar-node-0", "pid": 11}, {"node": None, "pid": 12}]})
    assert [list(r.values()) for r in rows] == [
        ["would stop", "cifar-node-0", 11], ["would stop", "(worker)", 12],
        ["would remove", "job cifar state", ""], ["checkpoints", "kept", ""]]


# --------------------------------------------------------------------------- help

def _command_table():
    from azure.cli.core.mock import DummyCli

    import azext_elastictrain

    loader = azext_elastictrain.COMMAND_LOADER_CLS(cli_ctx=DummyCli())
    return loader.load_command_table(None)


def test_every_command_has_help_with_an_example_and_every_help_parses() -> None:
    from knack.help_files import helps

    import azext_elastictrain._help  # noqa: F401

    ours = {k: yaml.safe_load(v) for k, v in helps.items() if k.startswith("elastictrain")}
    assert all(isinstance(doc, dict) and doc.get("short-summary") for doc in ours.values()), ours
    commands = [name for name in _command_table() if name.startswith("elastictrain ")]
    assert {"elastictrain job run", "elastictrain job list", "elastictrain job show", "elastictrain job logs",
            "elastictrain job wait", "elastictrain job delete"} <= set(commands)
    for name in commands:
        assert name in ours, f"no help for {name}"
        assert ours[name].get("examples"), f"no example for {name}"
        for example in ours[name]["examples"]:
            assert example["text"].startswith(f"az {name} "), example


def test_every_argument_of_every_command_has_help() -> None:
    import types

    from azure.cli.core.mock import DummyCli

    import azext_elastictrain

    cli = DummyCli()
    loader = azext_elastictrain.COMMAND_LOADER_CLS(cli_ctx=cli)
    table = loader.load_command_table(None)
    missing = []
    for name in sorted(n for n in table if n.startswith("elastictrain ")):
        cli.invocation = types.SimpleNamespace(data={"command_string": name})
        table[name].load_arguments()
        loader.command_name = name
        loader.load_arguments(name)
        for arg_name, arg in table[name].arguments.items():
            if arg_name == "cmd":  # az passes the command itself; never on the command line
                continue
            settings = dict(arg.type.settings)
            settings.update(loader.argument_registry.get_cli_argument(name, arg_name).settings)
            if not settings.get("help"):
                missing.append(f"{name} {arg_name}")
    assert not missing, "arguments without help: " + ", ".join(missing)


def test_a_script_inside_the_image_is_not_looked_for_here() -> None:
    from azext_elastictrain.core.spec import JobSpec, check_script_in_image

    job = JobSpec(name="cifar", script="/app/train.py")
    check_script_in_image(job.script)  # raises SpecError for what is no path; never looks at this machine
    with pytest.raises(SpecError, match="is not a file"):
        check_local_script(job.script)


def test_job_run_warns_when_a_restart_mode_script_gives_its_process_group_no_timeout(tmp_path, caplog) -> None:
    """The runtime's peer watch bounds a vanish once the script created its Checkpointer; before that only the
    script's own timeout does (core/script_check.py), so `job run` says so where it can read the script."""
    import logging

    from azext_elastictrain.core.script_check import init_without_timeout
    from azext_elastictrain.operations.job import _warn_default_group_timeout

    assert init_without_timeout('import torch.distributed as dist\ndist.init_process_group("nccl")\n') == [2]
    for given in ('dist.init_process_group("gloo", timeout=collective_timeout())',
                  'init_process_group("gloo", "env://", timedelta(seconds=60))', "init_process_group(**options)",
                  "not python (", ""):
        assert init_without_timeout(given) == [], given
    bare, readme = tmp_path / "bare.py", tmp_path / "readme.py"
    bare.write_text('import torch.distributed as dist\n\ndist.init_process_group("gloo")\n')
    readme.write_text('import torch.distributed as dist\n\ndist.init_process_group("gloo", timeout=t)\n')
    with caplog.at_level(logging.WARNING):
        _warn_default_group_timeout(spec(script=str(bare), recovery="restart"))
    assert len(caplog.records) == 1 and "(line 3)" in caplog.text and "30 minutes for gloo" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _warn_default_group_timeout(spec(script=str(readme), recovery="restart"))
        _warn_default_group_timeout(spec(script=str(bare), recovery="in-process"))  # no remote peer in its group
        _warn_default_group_timeout(spec(script=str(tmp_path / "image" / "train.py"), recovery="restart"))  # not here
    assert not caplog.records


HAND_WRITTEN = '''from azext_elastictrain.runtime import Checkpointer
ckpt = Checkpointer.from_env()
for step in range(10):
    if ckpt.step(step, state):
        break
'''


def test_a_script_that_loops_by_hand_is_found_and_the_runtime_loop_is_not() -> None:
    from azext_elastictrain.core.script_check import hand_written_loop

    assert hand_written_loop(HAND_WRITTEN) == 4
    assert hand_written_loop("import azext_elastictrain.runtime as rt\nc = rt.Checkpointer(store)\nc.step(1, s)\n") == 3
    for given in (HAND_WRITTEN + "for step, batch in ckpt.batches(state, loader, epochs=3):\n    pass\n",
                  HAND_WRITTEN.replace("range(10)", "ckpt.steps(state, total=10)"),
                  # the loop is in a module it imports: nothing to see here, so nothing is taken for one
                  "from mylib import train\nckpt = Checkpointer.from_env()\ntrain(ckpt)\n",
                  "ckpt = Checkpointer.from_env()\noptimizer.step()\n",  # another object's step()
                  "print('no checkpointer at all')", "not python (", ""):
        assert hand_written_loop(given) is None, given


@pytest.mark.parametrize("kind", ["local", "aks"])
def test_a_hand_written_loop_runs_in_restart_unless_in_process_was_asked_for(tmp_path, caplog, kind) -> None:
    """The in-process mode refuses ckpt.step() in every worker at its first step (a crash loop); job run looks
    first: where in-process is only the default the job runs in restart, with a warning; asked for, it is refused
    before anything starts. A script it cannot read (a path in an AKS image) keeps the mode."""
    import logging
    from types import SimpleNamespace

    from azext_elastictrain.core import launch
    from azext_elastictrain.operations.job import _recovery_for

    by_hand, readme = tmp_path / "by_hand.py", tmp_path / "readme.py"
    by_hand.write_text(HAND_WRITTEN)
    readme.write_text(HAND_WRITTEN.replace("range(10)", "ckpt.steps(state, total=10)"))
    target = SimpleNamespace(kind=kind)
    default = launch.PROFILES[kind].default_recovery
    with caplog.at_level(logging.WARNING):
        assert _recovery_for(target, str(readme), None) == default
        assert _recovery_for(target, str(tmp_path / "image" / "train.py"), launch.RECOVERY_IN_PROCESS) == \
            launch.RECOVERY_IN_PROCESS
        assert _recovery_for(target, str(by_hand), launch.RECOVERY_RESTART) == launch.RECOVERY_RESTART
    assert not caplog.records
    with pytest.raises(SpecError, match=r"loops by hand \(ckpt.step\(\) at line 4.*--recovery restart"):
        _recovery_for(target, str(by_hand), launch.RECOVERY_IN_PROCESS)
    with caplog.at_level(logging.WARNING):
        assert _recovery_for(target, str(by_hand), None) == launch.RECOVERY_RESTART
    assert ("runs in --recovery restart" in caplog.text) == (default == launch.RECOVERY_IN_PROCESS)


def test_each_recovery_mode_answers_what_a_launch_asks_of_it() -> None:
    """A launch asks the job's mode (core/launch.py MODES) instead of branching on its name: every mode has one,
    and each node's torchrun world is the backend's rendezvous or a world of the node's own."""
    from azext_elastictrain.core import launch

    assert set(launch.MODES) == set(launch.RECOVERY_MODES)
    rendezvous = ["--rdzv-backend=etcd-v2", "--nnodes=1:3"]
    restart = JobSpec(name="job", script="train.py", recovery=launch.RECOVERY_RESTART).mode
    in_process = JobSpec(name="job", script="train.py", recovery=launch.RECOVERY_IN_PROCESS).mode
    assert not restart.coordinator and restart.node_world(nproc_per_node=2, rendezvous=rendezvous) == rendezvous
    assert in_process.coordinator and in_process.node_world(nproc_per_node=2, rendezvous=rendezvous) == \
        launch.standalone_torchrun_options(nproc_per_node=2)
