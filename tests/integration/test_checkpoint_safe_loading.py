"""Restore unpickles nothing read from blob storage: a planted pickle is refused and never runs.

Whoever can write the container can forge a whole checkpoint (data, metadata,
manifest with matching checksums). The forged checkpoint here carries pickle
payloads that create a marker file when unpickled: where the RNG state goes
(as a DCP bytes item) and in DCP's own pickled ``.metadata``.
"""
from __future__ import annotations

import io
import pathlib
import pickle
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from azext_elastictrain.core import catalog, layout
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime.checkpoint import CheckpointError, Checkpointer
from azext_elastictrain.runtime.planners import TensorSavePlanner
from azext_elastictrain.runtime.state import StateTree, json_tensor
from azext_elastictrain.runtime.storage import BlobCheckpointWriter
from harness import services as svc

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
              pytest.mark.usefixtures("no_scheduled_events")]

JOB = "job"
RNG_ITEM = "_elastictrain.rng.0.python_extra"


class Plant:
    """Unpickling this creates ``marker``: proof that something unpickled it."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


class PlantingPlanner(TensorSavePlanner):
    """Our planner, but the RNG item is written as DCP's default planner would write an object: pickled."""

    def transform_object(self, write_item, object):  # noqa: A002
        if write_item.index.fqn == RNG_ITEM:
            return io.BytesIO(pickle.dumps(object))
        return super().transform_object(write_item, object)


class PlantingWriter(BlobCheckpointWriter):
    """Our writer, but DCP's pickled ``.metadata`` carries a payload too."""

    def __init__(self, *args, plant: Plant, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._plant = plant

    def finish(self, metadata, results) -> None:
        metadata.planner_data = self._plant
        super().finish(metadata, results)


def state(seed: int) -> dict:
    torch.manual_seed(seed)
    return {"model": nn.Linear(4, 3), "epoch": seed}


def forge(store: BlobStore, step: int, flat: dict, plant: Plant) -> None:
    """Commit a checkpoint the way an attacker with write access to the container could."""
    def commit(files: list[layout.FileEntry]) -> None:
        manifest = layout.Manifest(step=step, created=time.time(), world_size=1, writer="forged",
                                   files=layout.manifest_files(files))
        store.create(layout.manifest_name(JOB, step), manifest.to_bytes())

    path = layout.writer_prefix(JOB, step, "forged").rstrip("/")
    dcp.save(flat, storage_writer=PlantingWriter(store, path, commit, plant=plant),
             planner=PlantingPlanner(), no_dist=True)


def test_a_planted_pickle_where_the_rng_state_goes_is_refused_and_never_runs(azurite: svc.AzuriteService,
                                                                             container_url: str,
                                                                             tmp_path: pathlib.Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    marker = tmp_path / "unpickled"
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(Plant(control)))  # the payload is live: unpickling it does create the file
    assert control.exists()

    store = BlobStore.from_url(f"{container_url}/{JOB}", connection_string=azurite.connection_string)
    try:
        with Checkpointer(store, watcher=None, events=False) as ckpt:
            ckpt.save(1, state(1), blocking=True)
        flat = {k: v if isinstance(v, torch.Tensor) else json_tensor(v, k) for k, v in StateTree(state(2)).flat.items()}
        flat.update({RNG_ITEM: Plant(marker), "_elastictrain.step": json_tensor(2, "step")})
        forge(store, 2, flat, Plant(marker))
        assert [c.step for c in catalog.list_checkpoints(store, JOB) if c.complete] == [1, 2]

        restored = state(3)
        with Checkpointer(store, watcher=None, events=False) as ckpt:
            assert ckpt.restore(restored) == 1  # the forged step 2 is refused; the previous one loads
        assert restored["epoch"] == 1
        assert torch.equal(restored["model"].weight, state(1)["model"].weight)
        assert not marker.exists(), "restore unpickled the planted payload"
        assert f"checkpoint item '{RNG_ITEM}' is a bytes item" in caplog.text
        assert "refusing to deserialize it" in caplog.text
    finally:
        store.close()


def test_a_checkpoint_with_only_pickled_metadata_is_refused_loudly_not_skipped(azurite: svc.AzuriteService,
                                                                               container_url: str) -> None:
    """What an earlier version wrote: restoring must not quietly start the job over."""
    store = BlobStore.from_url(f"{container_url}/{JOB}", connection_string=azurite.connection_string)
    try:
        with Checkpointer(store, watcher=None, events=False) as ckpt:
            ckpt.save(1, state(1), blocking=True)
        manifest = layout.Manifest.from_bytes(store.read(layout.manifest_name(JOB, 1)))
        kept = [f for f in manifest.files if not f.path.endswith("/.metadata.json")]
        assert len(kept) == len(manifest.files) - 1
        store.delete([layout.checkpoint_prefix(JOB, 1) + f.path for f in manifest.files if f not in kept]
                     + [layout.manifest_name(JOB, 1)])
        store.create(layout.manifest_name(JOB, 1), layout.Manifest(
            step=1, created=manifest.created, world_size=1, writer=manifest.writer, files=kept).to_bytes())

        with Checkpointer(store, watcher=None, events=False) as ckpt:
            with pytest.raises(CheckpointError, match="written by an earlier elastictrain whose metadata is pickled"):
                ckpt.restore(state(3))
    finally:
        store.close()
