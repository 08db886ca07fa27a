"""backends/local/record.py: a local job's record and its spec, mapped in one place both ways."""
from __future__ import annotations

from dataclasses import fields, replace

import pytest

from azext_elastictrain.backends.local import record
from azext_elastictrain.core.launched import launched
from azext_elastictrain.core.spec import JobSpec

SPEC = JobSpec(name="cifar", script="/repo/scripts/train_cifar10.py", min_nodes=1, max_nodes=3, nodes=2,
               nproc_per_node=2, script_args=("--steps", "40"), checkpoint_interval=5, keep=4, memory_tier="off",
               warm_start=False)


def test_a_recorded_spec_reads_back_as_it_was_started() -> None:
    recorded = record.new_record(SPEC, cluster="local", script=SPEC.script, rdzv_id="cifar-1")
    assert record.spec_of(recorded) == SPEC
    assert recorded["nodeCount"] == 2 and recorded["scriptArgs"] == ["--steps", "40"] and recorded["nodes"] == []


def test_every_option_of_the_spec_is_recorded_and_shown() -> None:
    recorded = record.new_record(SPEC, cluster="local", script=SPEC.script, rdzv_id="cifar-1")
    shown = launched(record.spec_of(recorded), created=None, checkpoint_url="http://127.0.0.1:1/devstoreaccount1/"
                     "checkpoints/cifar", rdzv_id=recorded["rdzvId"])
    names = {f.name for f in fields(JobSpec)} - {"name", "nodes"}
    camel = {n.split("_")[0] + "".join(p.title() for p in n.split("_")[1:]) for n in names}
    assert camel <= set(shown) and shown["nodeCount"] == 2 and shown["rdzvId"] == "cifar-1"


# The record of a job started before warm starts existed has no warmStart: it ran without them. `job show` said
# False and a node that joined it later was started warm (backends/local/evict.py read True): one answer now.
def test_a_record_from_before_warm_starts_reads_as_without_them_for_show_and_for_a_new_node() -> None:
    recorded = record.new_record(replace(SPEC, warm_start=True), cluster="local", script=SPEC.script,
                                 rdzv_id="cifar-1")
    del recorded["warmStart"], recorded["memoryTier"]
    assert record.spec_of(recorded).warm_start is False
    assert launched(record.spec_of(recorded), created=None, checkpoint_url="u", rdzv_id="r")["warmStart"] is False
    assert record.spec_of(recorded).memory_tier == JobSpec(name="x", script="y").memory_tier


def test_a_record_without_a_required_field_is_refused() -> None:
    recorded = record.new_record(SPEC, cluster="local", script=SPEC.script, rdzv_id="cifar-1")
    del recorded["script"]
    with pytest.raises(KeyError, match="script"):
        record.spec_of(recorded)
