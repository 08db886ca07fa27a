"""A job's script arguments reach the script untouched, whatever they look like, on both backends.

torchrun's parser (argparse with abbreviations) used to read the script's arguments as its own: ``--n 4096``
was refused as an ambiguous abbreviation of ``--nnodes``/``--nproc-per-node`` before the first step. Both
backends end torchrun's options with ``--`` before the script (core/launch.py ``worker_entry``). Checked here
with real torchrun (warm and cold entry points) and with torchrun's own parser over the AKS manifests as the
pods run them (the ElasticJob operator prepends its rendezvous options to the container's args). The local
backend's ``job run --script-args`` is checked end to end by tests/e2e/test_readme.py.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser

from azext_elastictrain.core import launch
from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.spec import JobSpec

REPO = Path(__file__).resolve().parents[2]
# Options of torchrun itself and their abbreviations, the launcher's, a module flag, a value with spaces, a
# "--" of the script's own and an "=" form.
AWKWARD = ("--n", "4096", "--nnodes", "3", "-m", "x", "--max-restarts", "2", "--agent", "a value with spaces",
           "--", "--nproc-per-node=8", "--standalone")
CLUSTER = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                          checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
JOB = JobSpec(name="args", script="/app/train.py", min_nodes=1, max_nodes=3, nodes=2, nproc_per_node=1,
              script_args=AWKWARD, checkpoint_interval=50, keep=3)
# What the TorchElastic operator puts before the container's args (DESIGN.md: it prepends its rendezvous).
OPERATOR_ARGS = ["--rdzv_backend=etcd", "--rdzv_endpoint=etcd:2379", "--rdzv_id=args", "--nnodes=1:3"]

PRINT_ARGV = """
import json, os, sys
with open(os.path.join(os.environ["ARGS_OUT"], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(sys.argv[1:], f)
"""


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_real_torchrun_hands_the_script_its_arguments_untouched(tmp_path, warm) -> None:
    script = tmp_path / "print_argv.py"
    script.write_text(PRINT_ARGV)
    env = {**os.environ, "ARGS_OUT": str(tmp_path), "OMP_NUM_THREADS": "1", launch.ENV_WARM_DIR: str(tmp_path / "w"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    agent = subprocess.run(
        [sys.executable, *launch.agent_module(warm=warm), "--standalone", "--nnodes=1", "--nproc-per-node=1",
         "--max-restarts=0", "--monitor-interval=0.2", *launch.worker_entry(str(script), AWKWARD, warm=warm)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False)
    assert agent.returncode == 0, (agent.stdout + agent.stderr)[-3000:]
    assert json.loads((tmp_path / "0.json").read_text()) == list(AWKWARD)


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
@pytest.mark.parametrize("engine", ["torchelastic", "k8s-job"])
def test_the_aks_manifests_give_the_script_its_arguments_through_torchruns_parser(engine, warm) -> None:
    job = dataclasses.replace(JOB, warm_start=warm)
    if engine == "torchelastic":
        pod = m.render_elastic_job(job, CLUSTER, "img:1", run_id="args-1")["spec"]["replicaSpecs"]["Worker"]
        args = OPERATOR_ARGS + pod["template"]["spec"]["containers"][0]["args"]
    else:
        (indexed,) = [o for o in m.render_k8s_job(job, CLUSTER, "img:1", run_id="args-1") if o["kind"] == "Job"]
        args = indexed["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = get_args_parser().parse_args(args)  # torchrun's own parser, as the pod's agent runs it
    entry = [parsed.training_script, *parsed.training_script_args]
    if warm:  # torchrun runs the launcher as a module; it takes the script and its arguments
        assert parsed.module and entry[0] == launch.WARM_START_MODULE
        entry = entry[1:]
    assert entry == ["/app/train.py", *AWKWARD]
    assert parsed.nproc_per_node == "1" and parsed.max_restarts == launch.MAX_RESTARTS
