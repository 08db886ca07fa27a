"""Elastic CIFAR-10 training with blob checkpoints — the example job.

    torchrun --nnodes=1:2 --nproc-per-node=1 --rdzv-backend=etcd-v2 ... scripts/train_cifar10.py --steps 300

Data: real CIFAR-10 when ``--data`` points at it (the extracted
``cifar-10-batches-py`` folder, the ``cifar-10-python.tar.gz`` archive, or a
blob URL of that archive); otherwise scikit-learn's bundled handwritten
digits (8x8, 10 classes), so it learns visibly on a laptop with no network.

Elastic by construction: a ``DataLoader`` draws from the runtime's
``ElasticSampler``, whose global batch is fixed and whose epoch order depends
only on (seed, epoch), never on the world size; its position (samples trained
in the epoch) is checkpointed with the model, so ranks can come and go and a
resumed run sees exactly the batches it would have seen, each sample once per
epoch. Each rank takes an equal slice of the global batch; DDP averages gradients.
The loop is the runtime's (``ckpt.batches(state, loader, steps=N)``), so it runs in
both recovery modes: workers that outlive a re-form (the local default) and
torchrun restarts (``job run --recovery restart``).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import pickle
import sys
import tarfile
import time
import uuid
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from azext_elastictrain.runtime import Checkpointer, ElasticSampler, TrainingState, collective_timeout  # noqa: E402

try:  # the offline dataset; imported at the top so a node's warm server imports it once (runtime/warm.py)
    from sklearn.datasets import load_digits
except ImportError:  # only --data (CIFAR-10) then
    load_digits = None

log = logging.getLogger("train")

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


# -- data -------------------------------------------------------------------------
def load_dataset(data: str | None) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(images NCHW float32 normalised, labels int64, name)."""
    if data:
        return (*_load_cifar10(data), "cifar10")
    if load_digits is None:
        raise SystemExit("train_cifar10: without --data it trains on scikit-learn's digits: pip install scikit-learn")
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = (images - 0.5) / 0.5
    return images, torch.tensor(digits.target, dtype=torch.int64), "digits"


def _load_cifar10(source: str) -> tuple[torch.Tensor, torch.Tensor]:
    batches = _cifar_batches(source)
    images = torch.cat([torch.tensor(b[b"data"], dtype=torch.uint8) for b in batches])
    labels = torch.cat([torch.tensor(b[b"labels"], dtype=torch.int64) for b in batches])
    images = images.view(-1, 3, 32, 32).float() / 255.0
    mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    return (images - mean) / std, labels


def _cifar_batches(source: str) -> list[dict]:
    names = [f"data_batch_{i}" for i in range(1, 6)]
    if source.startswith(("http://", "https://")):
        from azext_elastictrain.core.blobstore import BlobStore

        store = BlobStore.from_url(source.rsplit("/", 1)[0] + "/",
                                   connection_string=os.environ.get("AZURE_STORAGE_CONNECTION_STRING"))
        blob = source.split("/")[-1]
        raw = store.read(f"{store.prefix}/{blob}" if store.prefix else blob)
        return _from_tar(tarfile.open(fileobj=io.BytesIO(raw)), names)
    path = Path(source)
    if path.is_file():
        return _from_tar(tarfile.open(path), names)
    if (path / "cifar-10-batches-py").is_dir():
        path = path / "cifar-10-batches-py"
    return [_cifar_batch(io.BytesIO((path / n).read_bytes()), n) for n in names]


def _from_tar(archive: tarfile.TarFile, names: list[str]) -> list[dict]:
    members = {Path(m.name).name: m for m in archive.getmembers()}
    return [_cifar_batch(archive.extractfile(members[n]), n) for n in names]


# CIFAR-10's python format is pickles of numpy arrays, and the archive may come from storage: a plain pickle.load
# would run whatever callable a tampered file names. This unpickler builds only what those files hold (dicts,
# lists, bytes, numbers and uint8 arrays); any other global is refused before it is called (the "Restricting
# Globals" recipe of the pickle docs).
_CIFAR_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),  # numpy 1.x / 2.x
    ("numpy", "ndarray"), ("numpy", "dtype"),
})


class _CifarUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _CIFAR_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a CIFAR-10 batch; refusing to load it")
        return super().find_class(module, name)


def _cifar_batch(stream, name: str) -> dict:
    """One CIFAR-10 python batch: {b"data": uint8 (N, 3072), b"labels": N ints}, or ValueError."""
    batch = _CifarUnpickler(stream, encoding="bytes").load()
    data, labels = (batch.get(b"data"), batch.get(b"labels")) if isinstance(batch, dict) else (None, None)
    if (getattr(data, "dtype", None) != "uint8" or getattr(data, "shape", (0, 0))[1:] != (3 * 32 * 32,)
            or not isinstance(labels, list) or len(labels) != len(data)
            or not all(isinstance(x, int) and 0 <= x < 10 for x in labels)):
        raise ValueError(f"{name} is not a CIFAR-10 batch (uint8 rows of 3x32x32 and as many labels 0-9)")
    return batch


def make_loader(images: torch.Tensor, labels: torch.Tensor, global_batch: int, seed: int,
                workers: int = 0) -> tuple[DataLoader, ElasticSampler]:
    """A DataLoader of (image, label, sample id) slices of each global batch, and its checkpointable sampler.

    The final partial global batch of an epoch is dropped, so every step has the same size on every rank.
    """
    dataset = TensorDataset(images, labels, torch.arange(len(labels)))
    sampler = ElasticSampler(dataset, global_batch, seed=seed, drop_last=True)
    if sampler.batches_per_epoch == 0:
        raise ValueError(f"--global-batch {global_batch} is larger than the dataset ({len(labels)} samples)")
    return DataLoader(dataset, batch_sampler=sampler, num_workers=workers), sampler


def augment(images: torch.Tensor) -> torch.Tensor:
    """Random horizontal flips and 4-pixel shifts (CIFAR); uses torch's RNG, which checkpoints restore."""
    flip = torch.rand(images.shape[0]) < 0.5
    images = torch.where(flip.view(-1, 1, 1, 1), images.flip(3), images)
    padded = F.pad(images, (4, 4, 4, 4), mode="reflect")
    dx, dy = torch.randint(0, 9, (2,)).tolist()
    return padded[:, :, dy:dy + images.shape[2], dx:dx + images.shape[3]]


# -- model ------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.skip(x))


class ResNet(nn.Module):
    """A small ResNet: three stages of basic blocks, global pooling, one linear head."""

    def __init__(self, in_channels: int, classes: int = 10, width: int = 32):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.stages = nn.Sequential(
            Block(width, width, 1), Block(width, 2 * width, 2), Block(2 * width, 4 * width, 2),
        )
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# -- training -------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="total global steps to train")
    p.add_argument("--global-batch", type=int, default=64, help="samples per step across all ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--width", type=int, default=32, help="channels of the first stage")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=os.environ.get("CIFAR10_DATA"),
                   help="CIFAR-10 folder, .tar.gz or blob URL (default: offline digits)")
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints")
    p.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (demos and tests)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--save-final", default=None, help="rank 0 writes the final model state_dict here")
    p.add_argument("--loader-workers", type=int, default=0, help="DataLoader worker processes per rank")
    p.add_argument("--sample-log", default=None,
                   help="folder: every rank appends (attempt, step, epoch, sample ids) of each trained step, as JSON lines")
    return p.parse_args(argv)


def setup_distributed() -> torch.device:
    if "RANK" not in os.environ:
        return torch.device("cpu")
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("cpu:gloo,cuda:nccl", timeout=collective_timeout())
        return torch.device("cuda", local_rank)
    dist.init_process_group("gloo", timeout=collective_timeout())  # a vanished peer fails, not hangs
    return torch.device("cpu")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    device = setup_distributed()
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1

    images, labels, name = load_dataset(args.data)
    try:
        loader, sampler = make_loader(images, labels, args.global_batch, args.seed, args.loader_workers)
    except ValueError as ex:  # e.g. a global batch this world size does not divide
        raise SystemExit(f"train_cifar10: {ex}") from None
    torch.manual_seed(args.seed)  # identical initial weights on every rank and every run
    model = ResNet(images.shape[1], width=args.width).to(device)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps)
    state = {"train": TrainingState(model, optimizer, scheduler), "data": sampler}

    overrides = {"interval_steps": args.checkpoint_every} if args.checkpoint_every else {}
    ckpt = Checkpointer.from_env(**overrides)
    torch.manual_seed(args.seed * 7919 + rank)  # per-rank augmentation stream (restored on resume)
    sample_log = open_sample_log(args.sample_log, rank)
    start = None
    loss_value = float("nan")
    window_start, window_samples = time.monotonic(), 0
    # The runtime's loop (both recovery modes): restores the state, hands out the global batches left (this
    # rank's slice), checkpoints, ends the process on a stop, and records the job finished after the last step.
    for step, (x, y, ids) in ckpt.batches(state, loader, steps=args.steps):
        if start is None:  # the state is restored by now
            start = step - 1
            if scheduler.total_steps != args.steps:
                # Resumed with a different --steps: the restored schedule would end at the old length.
                log.warning("LR schedule was for %d steps; stretching it to %d", scheduler.total_steps, args.steps)
                scheduler.total_steps = args.steps
            if rank == 0:
                log.info("dataset %s: %d samples; world size %d; %s at step %d of %d",
                         name, len(labels), world, "resuming" if start else "starting", start, args.steps)
        if name == "cifar10":
            x = augment(x)
        model.train()
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.step_delay:
            time.sleep(args.step_delay)
        optimizer.step()
        scheduler.step()
        if sample_log is not None:
            sample_log(step=step, epoch=sampler.epoch, world=world, ids=ids.tolist())
        loss_value = loss.item()
        ckpt.report(loss=loss_value)
        window_samples += args.global_batch
        if rank == 0 and (step % args.log_every == 0 or step == start + 1):
            rate = window_samples / max(time.monotonic() - window_start, 1e-9)
            log.info("step %d loss %.4f world %d %.1f samples/s", step, loss_value, world, rate)
            window_start, window_samples = time.monotonic(), 0

    if rank == 0:
        log.info("finished %d steps; final loss %.4f", args.steps, loss_value)
        if args.save_final:  # each node's rank 0 in the in-process mode (the same model): replace, never interleave
            weights = (model.module if hasattr(model, "module") else model).state_dict()
            partial = f"{args.save_final}.{os.getpid()}.tmp"
            torch.save({k: v.cpu() for k, v in weights.items()}, partial)
            os.replace(partial, args.save_final)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def open_sample_log(folder: str | None, rank: int) -> Callable[..., None] | None:
    """A writer of one JSON line per trained step into a file of this process's own (None without a folder).

    Lines carry this training attempt's id (rank 0's, shared by all ranks), so a reader can keep, for
    each step, the attempt that trained it last: a step trained after the last checkpoint before an
    eviction is trained again after the restore, and only that later attempt is in the final model.
    """
    if not folder:
        return None
    box = [uuid.uuid4().hex[:12]]
    if dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    Path(folder).mkdir(parents=True, exist_ok=True)
    out = open(Path(folder) / f"{box[0]}-rank{rank}.jsonl", "a", buffering=1, encoding="utf-8")

    def write(**record) -> None:
        out.write(json.dumps({"attempt": box[0], "rank": rank, "time": time.time(), **record}) + "\n")

    return write


def weights_digest(state_dict: dict) -> str:
    """A short fingerprint of model weights (for logs and comparisons)."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        h.update(key.encode())
        h.update(state_dict[key].detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    sys.exit(main())
