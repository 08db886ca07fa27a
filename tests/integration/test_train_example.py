"""The example job's data paths and its elastic batching, on small data made here."""
from __future__ import annotations

import importlib.util
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime.loop import epoch_batches

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_cifar10.py"
IMAGES_PER_BATCH = 6


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("train_cifar10", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cifar_batches() -> dict[str, bytes]:
    """CIFAR-10's python format: pickled dicts of uint8 rows (3x32x32) and labels."""
    rng = np.random.default_rng(0)
    return {
        f"data_batch_{i}": pickle.dumps({
            b"data": rng.integers(0, 256, (IMAGES_PER_BATCH, 3 * 32 * 32), dtype=np.uint8),
            b"labels": [int(x) for x in rng.integers(0, 10, IMAGES_PER_BATCH)],
        })
        for i in range(1, 6)
    }


def _tarball(batches: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in batches.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _check(images: torch.Tensor, labels: torch.Tensor, name: str) -> None:
    assert name == "cifar10"
    assert images.shape == (5 * IMAGES_PER_BATCH, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (5 * IMAGES_PER_BATCH,) and labels.dtype == torch.int64
    assert -2.5 < images.min() < 0 < images.max() < 2.5  # normalised per channel


def test_cifar10_loads_from_a_folder_an_archive_and_a_blob(train, tmp_path, azurite, container_url, monkeypatch):
    batches = _cifar_batches()
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name, data in batches.items():
        (folder / name).write_bytes(data)
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(_tarball(batches))
    store = BlobStore.from_url(container_url, connection_string=azurite.connection_string)
    store.create("datasets/cifar-10-python.tar.gz", archive.read_bytes())
    store.close()

    loaded = [train.load_dataset(str(tmp_path)), train.load_dataset(str(folder)), train.load_dataset(str(archive))]
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    loaded.append(train.load_dataset(f"{container_url}/datasets/cifar-10-python.tar.gz"))
    for images, labels, name in loaded:
        _check(images, labels, name)
        torch.testing.assert_close(images, loaded[0][0], rtol=0, atol=0)
        assert torch.equal(labels, loaded[0][1])


class _Payload:
    """A pickle that calls a function when loaded, as a tampered dataset in storage could."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("bad, expected", [
    ("payload", "is not part of a CIFAR-10 batch"),
    ("not-a-batch", "is not a CIFAR-10 batch"),
])
def test_a_tampered_cifar10_archive_is_refused_and_runs_nothing(train, tmp_path, bad, expected):
    marker = tmp_path / "ran"
    batches = _cifar_batches()
    batches["data_batch_3"] = pickle.dumps({b"data": _Payload(marker), b"labels": [1]} if bad == "payload"
                                           else {b"data": np.zeros((2, 5), dtype=np.float64), b"labels": [1, 2]})
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(_tarball(batches))
    with pytest.raises((pickle.UnpicklingError, ValueError), match=expected):
        train.load_dataset(str(archive))
    assert not marker.exists()


def test_offline_digits_are_the_fallback(train):
    images, labels, name = train.load_dataset(None)
    assert name == "digits" and images.shape == (1797, 1, 8, 8) and set(labels.tolist()) == set(range(10))


def test_the_script_reads_each_sample_once_per_epoch_through_a_dataloader(train):
    images, labels = torch.randn(100, 1, 8, 8), torch.arange(100) % 10
    loader, sampler = train.make_loader(images, labels, global_batch=16, seed=3)
    batches = epoch_batches(loader, sampler, 2)  # how ckpt.batches() draws them
    per_epoch = 100 // 16  # the final partial global batch is dropped
    seen = {0: [], 1: []}
    for _ in range(2 * per_epoch):
        x, y, ids = next(batches)
        epoch = sampler.epoch  # of the batch just drawn (the next epoch starts when the loop asks for it)
        assert torch.equal(x, images[ids]) and torch.equal(y, labels[ids])  # the ids are what was trained
        seen[epoch].extend(ids.tolist())
        sampler.advance()
    assert [len(set(s)) for s in seen.values()] == [per_epoch * 16] * 2  # no sample twice within an epoch
    assert seen[0][:16] == sampler.order(0)[:16] and seen[0] != seen[1]  # (seed, epoch) order, fresh each epoch
    with pytest.raises(ValueError, match="larger than the dataset"):
        train.make_loader(images, labels, global_batch=128, seed=0)
