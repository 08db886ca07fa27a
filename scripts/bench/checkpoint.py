#!/usr/bin/env python3
"""Benchmark (not a test): the runtime's Checkpointer against raw blob I/O on Azurite.

    .venv/bin/python scripts/bench/checkpoint.py                       # 64 and 512 MiB, 5 repetitions
    .venv/bin/python scripts/bench/checkpoint.py --sizes 64 --repeats 3
    .venv/bin/python scripts/bench/checkpoint.py --json out.json       # also every raw sample
    .venv/bin/python scripts/bench/checkpoint.py --fsspec              # require the adlfs comparison
    .venv/bin/python scripts/bench/checkpoint.py --profile             # + cProfile of one save/restore

Starts its own Azurite (data on disk in a temporary folder, always stopped)
and, for each state size S MiB, builds a float32 state of S MiB (a model-like
set of a few large and many small tensors plus an optimizer-like copy of each;
with ``--state module`` the raw ``{"model": nn.Module, "optimizer": AdamW}``
dict a script passes, with ``--state fsdp2`` the same model sharded by FSDP2's
``fully_shard`` in one gloo process).
Every repetition runs all variants interleaved (the order rotates from one
repetition to the next), under fresh blob names that are deleted afterwards:

* save:    ``Checkpointer.save(step, state, blocking=True)`` (bytes = the
           manifest's total) vs ``ContainerClient.upload_blob(max_concurrency=8)``
           of a prepared ``bytes`` of S MiB.                       goal ours/raw >= 0.9
* stall:   how long ``Checkpointer.save(step, state)`` (async) blocks vs a plain
           ``{k: v.clone()}`` of the same tensors; ``ckpt.wait()`` follows each
           save, untimed. ``stall`` is a save whose Snapshotter already has its
           buffers (the steady state), ``stall_first`` the first save of a fresh
           Checkpointer (it allocates them).                       goal stall/copy <= 1.5
* restore: ``Checkpointer.restore(state)`` (verify=True, and verify=False) vs
           ``download_blob(max_concurrency=8).readall()`` of the raw blob.
                                                                   goal ours/raw >= 0.9
* fsspec:  DCP's own ``FsspecWriter``/``FsspecReader`` over adlfs
           (``abfs://<container>/<path>``, storage option ``connection_string``,
           adlfs defaults otherwise; ``sync_files=False``, since with True DCP
           falls back to a machine-wide ``os.sync()`` for non-file streams),
           side by side with ours: ratio fsspec/ours (information, no goal).
           Runs when adlfs imports (``--fsspec`` makes it mandatory,
           ``--no-fsspec`` skips it).

The raw client uses the same 8 MiB block size as BlobStore. The shared
machine is noisy: read the ratios (of medians, and the median of the per-
repetition paired ratios), not the absolute numbers. Needs
``bash scripts/setup.sh`` (Azurite) first.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from azext_elastictrain.core import layout  # noqa: E402
from azext_elastictrain.core.blobstore import BLOCK_SIZE, BlobStore  # noqa: E402
from azext_elastictrain.runtime.checkpoint import Checkpointer  # noqa: E402
from harness.services import start_azurite  # noqa: E402

MiB = 1 << 20
CONTAINER = "bench"
RAW_CONCURRENCY = 8
MIN_REPEATS = 3

# (variant, baseline, direction, goal): direction "min" means ours/baseline
# throughput must be >= goal, "max" means seconds/baseline seconds <= goal;
# goal None is information only.
COMPARISONS = [
    ("save_ours", "save_raw", "min", 0.9),
    ("stall", "copy", "max", 1.5),
    ("stall_first", "copy", "max", None),
    ("restore_ours", "restore_raw", "min", 0.9),
    ("restore_ours_noverify", "restore_raw", "min", 0.9),
    ("save_fsspec", "save_ours", "min", None),
    ("restore_fsspec", "restore_ours", "min", None),
]
THROUGHPUT = {"save_raw", "save_ours", "save_fsspec", "restore_raw", "restore_ours",
              "restore_ours_noverify", "restore_fsspec"}


# --------------------------------------------------------------------------- the state


def _split(total: int, count: int) -> list[int]:
    base = total // count
    return [base] * (count - 1) + [total - base * (count - 1)]


def build_dict_state(size_mib: int) -> dict[str, Any]:
    """``{"train": {"model": {...}, "optim": {...}}}`` of float32 tensors totalling ``size_mib``.

    Model: 4 large tensors (85%) and 96 small ones; optimizer: one same-shaped
    "exp_avg" per model tensor (DCP flattens the nesting).
    """
    elems = size_mib * MiB // 4 // 2  # half model, half optimizer
    large = _split(int(elems * 0.85), 4)
    small = _split(elems - sum(large), 96)
    gen = torch.Generator().manual_seed(size_mib)
    model: dict[str, torch.Tensor] = {}
    for i, n in enumerate(large):
        model[f"layers.{i}.weight"] = torch.randn(n, generator=gen)
    for i, n in enumerate(small):
        model[f"blocks.{i}.norm"] = torch.randn(n, generator=gen)
    optim = {name: {"exp_avg": torch.randn(t.numel(), generator=gen)} for name, t in model.items()}
    return {"train": {"model": model, "optim": {"state": optim}}}


def _module_and_adamw(size_mib: int, shard: Callable[[torch.nn.Module], None] | None = None) -> dict[str, Any]:
    """A real ``nn.Module`` + AdamW (params, exp_avg, exp_avg_sq: ~3x params), as a script passes them."""
    params = size_mib * MiB // 4 // 3
    blocks = 8
    d = int((params / blocks) ** 0.5)
    torch.manual_seed(size_mib)
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(d, d), torch.nn.LayerNorm(d)]
    model = torch.nn.Sequential(*layers)
    if shard is not None:
        shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, d)).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"model": model, "optimizer": optimizer}


def build_module_state(size_mib: int) -> dict[str, Any]:
    """The raw ``{"model": model, "optimizer": AdamW}`` dict (no TrainingState)."""
    return _module_and_adamw(size_mib)


def build_fsdp2_state(size_mib: int) -> dict[str, Any]:
    """The same, the model sharded with FSDP2 ``fully_shard`` (one process, gloo: DTensor paths, CPU)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():
        from harness.services import free_port

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))

    def shard(model: torch.nn.Module) -> None:
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)

    return _module_and_adamw(size_mib, shard)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (shares its storage), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def live_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor of the state, by path (the live objects, not copies)."""
    out: dict[str, torch.Tensor] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, torch.Tensor):
            out[path] = _local(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}/{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}/{i}")

    for key, value in state.items():
        if isinstance(value, torch.nn.Module):
            walk(value.state_dict(), key)
        elif isinstance(value, torch.optim.Optimizer):
            walk({str(i): value.state[p] for i, p in enumerate(value.state)}, key)
        else:
            walk(value, key)
    return out


BUILDERS: dict[str, Callable[[int], dict[str, Any]]] = {
    "dict": build_dict_state, "module": build_module_state, "fsdp2": build_fsdp2_state}


# --------------------------------------------------------------------------- helpers


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def rotate(items: list[Any], by: int) -> list[Any]:
    by %= len(items)
    return items[by:] + items[:by]


def delete_prefix(store: BlobStore, container: Any, prefix: str) -> None:
    names = [b.name for b in container.list_blobs(name_starts_with=prefix)]
    if names:
        store.delete(names)


class Bench:
    def __init__(self, azurite: Any, args: argparse.Namespace):
        from azure.storage.blob import ContainerClient

        self.az = azurite
        self.args = args
        options = {"max_single_put_size": BLOCK_SIZE, "max_block_size": BLOCK_SIZE}
        self.raw = ContainerClient.from_connection_string(azurite.connection_string, CONTAINER, **options)
        self.raw.create_container()
        self.store = BlobStore.from_url(f"{azurite.blob_endpoint}/{CONTAINER}",
                                        connection_string=azurite.connection_string)
        self.fsspec_reason: str | None = None
        self.fsspec = self._fsspec_available()

    def close(self) -> None:
        self.store.close()
        self.raw.close()

    # -- fsspec ---------------------------------------------------------------
    def _fsspec_available(self) -> bool:
        if self.args.fsspec is False:
            self.fsspec_reason = "skipped (--no-fsspec)"
            return False
        try:
            import adlfs  # noqa: F401
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter  # noqa: F401
        except ImportError as ex:
            self.fsspec_reason = (f"adlfs/fsspec not importable ({ex}); `.venv/bin/pip install adlfs` "
                                  "(check that azure-storage-blob keeps its version)")
            if self.args.fsspec:
                raise SystemExit(f"--fsspec: {self.fsspec_reason}")
            return False
        return True

    def _fsspec_url(self, path: str) -> str:
        return f"abfs://{CONTAINER}/{path}"

    def fsspec_save(self, state: dict[str, Any], path: str) -> None:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        writer = FsspecWriter(self._fsspec_url(path), sync_files=False,
                              connection_string=self.az.connection_string)
        dcp.save(state, storage_writer=writer, no_dist=True)

    def fsspec_load(self, state: dict[str, Any], path: str) -> None:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        reader = FsspecReader(self._fsspec_url(path), connection_string=self.az.connection_string)
        dcp.load(state, storage_reader=reader, no_dist=True)

    # -- ours -------------------------------------------------------------------
    def checkpointer(self, prefix: str, verify: bool = True) -> Checkpointer:
        return Checkpointer(self.store, prefix, keep=1, verify=verify, watcher=None, events=False)

    def manifest_bytes(self, prefix: str, step: int) -> int:
        return layout.Manifest.from_bytes(self.store.read(layout.manifest_name(prefix, step))).total_bytes

    def listed_bytes(self, prefix: str) -> int:
        return sum(b.size for b in self.raw.list_blobs(name_starts_with=prefix))

    # -- one repetition -----------------------------------------------------------
    def repetition(self, state: dict[str, Any], reference: dict[str, torch.Tensor], raw_data: bytes,
                   rep: int, tag: str) -> dict[str, tuple[float, int]]:
        """All variants once, interleaved; {variant: (seconds, bytes)}."""
        prefix = f"{tag}/rep{rep}-{uuid.uuid4().hex[:8]}"
        out: dict[str, tuple[float, int]] = {}
        live = live_tensors(state)
        state_bytes = sum(t.numel() * t.element_size() for t in live.values())
        try:
            # 1. training stall vs the unavoidable copy
            ckpt = self.checkpointer(f"{prefix}/ours")
            try:
                def copy() -> None:
                    seconds, copied = timed(lambda: {k: v.clone() for k, v in live.items()})
                    del copied
                    out["copy"] = (seconds, state_bytes)

                def stalls() -> None:
                    seconds, _ = timed(lambda: ckpt.save(1, state))
                    out["stall_first"] = (seconds, state_bytes)
                    wait, _ = timed(ckpt.wait)
                    out["async_upload_after_stall_first"] = (wait, state_bytes)
                    seconds, _ = timed(lambda: ckpt.save(2, state))
                    out["stall"] = (seconds, state_bytes)
                    wait, _ = timed(ckpt.wait)
                    out["async_upload_after_stall"] = (wait, state_bytes)

                for fn in ([copy, stalls] if rep % 2 == 0 else [stalls, copy]):
                    gc.collect()
                    fn()

                # 2. save throughput
                def save_ours() -> None:
                    seconds, _ = timed(lambda: ckpt.save(3, state, blocking=True))
                    ckpt.wait()
                    out["save_ours"] = (seconds, self.manifest_bytes(f"{prefix}/ours", 3))

                def save_raw() -> None:
                    seconds, _ = timed(lambda: self.raw.upload_blob(f"{prefix}/raw.bin", raw_data,
                                                                    max_concurrency=RAW_CONCURRENCY))
                    out["save_raw"] = (seconds, len(raw_data))

                def save_fsspec() -> None:
                    seconds, _ = timed(lambda: self.fsspec_save(state, f"{prefix}/fsspec"))
                    out["save_fsspec"] = (seconds, self.listed_bytes(f"{prefix}/fsspec/"))

                saves = [save_ours, save_raw] + ([save_fsspec] if self.fsspec else [])
                for fn in rotate(saves, rep):
                    gc.collect()
                    fn()
            finally:
                ckpt.close()

            # 3. restore throughput (every load lands in the live tensors, zeroed first and checked after)
            def check(variant: str) -> None:
                for name, ref in reference.items():
                    if not torch.equal(live[name], ref):
                        raise AssertionError(f"{variant}: {name} differs from what was saved")

            def restore_ours(verify: bool) -> Callable[[], None]:
                variant = "restore_ours" if verify else "restore_ours_noverify"

                def run() -> None:
                    reader = self.checkpointer(f"{prefix}/ours", verify=verify)
                    try:
                        for t in live.values():
                            t.zero_()
                        seconds, step = timed(lambda: reader.restore(state))
                    finally:
                        reader.close()
                    if step != 3:
                        raise AssertionError(f"{variant}: restored step {step}, expected 3")
                    check(variant)
                    out[variant] = (seconds, self.manifest_bytes(f"{prefix}/ours", 3))

                return run

            def restore_raw() -> None:
                seconds, data = timed(lambda: self.raw.download_blob(
                    f"{prefix}/raw.bin", max_concurrency=RAW_CONCURRENCY).readall())
                if len(data) != len(raw_data):
                    raise AssertionError(f"raw download: {len(data)} of {len(raw_data)} bytes")
                del data
                out["restore_raw"] = (seconds, len(raw_data))

            def restore_fsspec() -> None:
                for t in live.values():
                    t.zero_()
                seconds, _ = timed(lambda: self.fsspec_load(state, f"{prefix}/fsspec"))
                check("restore_fsspec")
                out["restore_fsspec"] = (seconds, out["save_fsspec"][1])

            restores = [restore_ours(True), restore_raw, restore_ours(False)]
            if self.fsspec:
                restores.append(restore_fsspec)
            for fn in rotate(restores, rep):
                gc.collect()
                fn()
        finally:
            delete_prefix(self.store, self.raw, prefix + "/")
        return out

    def warm_up(self, build: Callable[[int], dict[str, Any]]) -> None:
        """One untimed 1 MiB round: imports, connections, DCP planning caches; checks fsspec works."""
        state = build(1)
        reference = {k: v.clone() for k, v in live_tensors(state).items()}
        if self.fsspec:
            try:
                path = f"warmup/fsspec-probe-{uuid.uuid4().hex[:8]}"
                self.fsspec_save(state, path)
                self.fsspec_load(state, path)
                delete_prefix(self.store, self.raw, path + "/")
            except Exception as ex:  # noqa: BLE001 - reported, and the comparison is skipped
                self.fsspec = False
                self.fsspec_reason = f"adlfs could not talk to Azurite: {type(ex).__name__}: {ex}"
                if self.args.fsspec:
                    raise SystemExit(f"--fsspec: {self.fsspec_reason}") from ex
        self.repetition(state, reference, os.urandom(MiB), 0, "warmup")

    def profile(self, state: dict[str, Any]) -> str:
        """cProfile (calling thread only) of one blocking save and one restore."""
        prefix = f"profile/{uuid.uuid4().hex[:8]}"
        text = io.StringIO()
        ckpt = self.checkpointer(prefix)
        try:
            for title, fn in (("save(blocking=True)", lambda: ckpt.save(1, state, blocking=True)),
                              ("restore(verify=True)", lambda: ckpt.restore(state))):
                prof = cProfile.Profile()
                seconds, _ = timed(lambda: prof.runcall(fn))
                text.write(f"\n== cProfile of {title}: {seconds:.2f}s wall, calling thread only ==\n")
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        finally:
            ckpt.close()
            delete_prefix(self.store, self.raw, prefix + "/")
        return text.getvalue().replace(str(REPO_ROOT) + os.sep, "")


# --------------------------------------------------------------------------- results


def summarize(size_mib: int, samples: dict[str, list[tuple[float, int]]]) -> dict[str, Any]:
    variants: dict[str, Any] = {}
    for name, values in samples.items():
        seconds = [s for s, _ in values]
        nbytes = [b for _, b in values]
        med = statistics.median(seconds)
        entry = {
            "n": len(values),
            "median_s": med,
            "min_s": min(seconds),
            "max_s": max(seconds),
            "bytes": statistics.median(nbytes),
            "samples_s": seconds,
            "samples_bytes": nbytes,
        }
        if name in THROUGHPUT:
            entry["median_mib_s"] = statistics.median(nbytes) / MiB / med if med > 0 else None
            entry["samples_mib_s"] = [b / MiB / s for s, b in values]
        variants[name] = entry
    comparisons = []
    for variant, baseline, direction, goal in COMPARISONS:
        if variant not in variants or baseline not in variants:
            continue
        v, b = variants[variant], variants[baseline]
        if direction == "min":
            ratio = v["median_mib_s"] / b["median_mib_s"]
            paired = statistics.median(x / y for x, y in zip(v["samples_mib_s"], b["samples_mib_s"]))
        else:
            ratio = v["median_s"] / b["median_s"]
            paired = statistics.median(x / y for x, y in zip(v["samples_s"], b["samples_s"]))
        verdict = None if goal is None else (ratio >= goal if direction == "min" else ratio <= goal)
        comparisons.append({
            "variant": variant, "baseline": baseline, "size_mib": size_mib,
            "measure": "throughput ratio" if direction == "min" else "time ratio",
            "ratio_of_medians": ratio, "median_paired_ratio": paired,
            "goal": None if goal is None else (f">= {goal}" if direction == "min" else f"<= {goal}"),
            "pass": verdict,
        })
    return {"size_mib": size_mib, "variants": variants, "comparisons": comparisons}


ORDER = ["save_raw", "save_ours", "save_fsspec", "copy", "stall", "stall_first",
         "restore_raw", "restore_ours", "restore_ours_noverify", "restore_fsspec",
         "async_upload_after_stall", "async_upload_after_stall_first"]


def table(result: dict[str, Any]) -> str:
    rows = [("variant", "size", "n", "median s", "MiB/s", "vs", "ratio", "paired", "goal", "result")]
    for size in result["sizes"]:
        comps = {c["variant"]: c for c in size["comparisons"]}
        names = [n for n in ORDER if n in size["variants"]] + \
                [n for n in size["variants"] if n not in ORDER]
        for name in names:
            v = size["variants"][name]
            c = comps.get(name)
            mib_s = v.get("median_mib_s")
            rows.append((
                name,
                f"{size['size_mib']} MiB",
                str(v["n"]),
                f"{v['median_s']:.3f}",
                "" if mib_s is None else f"{mib_s:.1f}",
                c["baseline"] if c else "",
                f"{c['ratio_of_medians']:.3f}" if c else "",
                f"{c['median_paired_ratio']:.3f}" if c else "",
                (c["goal"] or "info") if c else "",
                ("" if c is None else "-" if c["pass"] is None else "PASS" if c["pass"] else "MISS"),
            ))
        rows.append(None)  # type: ignore[arg-type]
    rows = rows[:-1]
    body = [r for r in rows if r is not None]
    widths = [max(len(r[i]) for r in body) for i in range(len(body[0]))]

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(w) if i in (0, 5, 8) else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(row, widths))).rstrip()

    lines = [fmt(rows[0]), "  ".join("-" * w for w in widths)]
    for row in rows[1:]:
        lines.append("" if row is None else fmt(row))
    lines.append("")
    lines.append("ratio = ours/baseline of median throughput (time for stall rows); "
                 "paired = median of per-repetition ratios")
    if result.get("fsspec_note"):
        lines.append(f"fsspec/adlfs: {result['fsspec_note']}")
    return "\n".join(lines)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("azure-storage-blob", "azure-core", "fsspec", "adlfs"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None  # type: ignore[assignment]
    return out


def _sizes(value: str) -> list[int]:
    sizes = [int(v) for v in value.split(",") if v.strip()]
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError("sizes are positive MiB counts, e.g. 64,512")
    return sizes


def _repeats(value: str) -> int:
    n = int(value)
    if n < MIN_REPEATS:
        raise argparse.ArgumentTypeError(f"need at least {MIN_REPEATS} repetitions")
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=_sizes, default=[64, 512], help="state sizes in MiB (default 64,512)")
    parser.add_argument("--repeats", type=_repeats, default=5, help=f"repetitions (>= {MIN_REPEATS}; default 5)")
    parser.add_argument("--json", metavar="PATH", help="write the results with every raw sample here")
    parser.add_argument("--state", choices=sorted(BUILDERS), default="dict",
                        help="dict: plain nested dict of tensors (default); module: the raw {'model': nn.Module, "
                             "'optimizer': AdamW} dict; fsdp2: the same with the model sharded by fully_shard")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fsspec", dest="fsspec", action="store_true", default=None,
                       help="require the DCP FsspecWriter/adlfs comparison (default: run it if adlfs imports)")
    group.add_argument("--no-fsspec", dest="fsspec", action="store_false", help="skip the adlfs comparison")
    parser.add_argument("--profile", action="store_true",
                        help="after measuring, cProfile one save and one restore of the largest size")
    args = parser.parse_args(argv)
    build = BUILDERS[args.state]
    if args.state != "dict" and args.fsspec:
        raise SystemExit("--fsspec compares plain dict states only (--state dict)")
    if args.state != "dict":
        args.fsspec = False  # DCP's own save of a raw optimizer is not what a script would do

    started = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "checkpoint",
        "args": {"sizes_mib": args.sizes, "repeats": args.repeats, "state": args.state},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "versions": versions(),
        "block_size": BLOCK_SIZE,
        "raw_max_concurrency": RAW_CONCURRENCY,
        "sizes": [],
    }
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp, start_azurite(tmp) as azurite:
        bench = Bench(azurite, args)
        try:
            print(f"azurite up; warming up (fsspec: {'on' if bench.fsspec else bench.fsspec_reason})",
                  file=sys.stderr, flush=True)
            bench.warm_up(build)
            state = None
            for size in args.sizes:
                state = reference = raw_data = None
                gc.collect()
                state = build(size)
                reference = {k: v.clone() for k, v in live_tensors(state).items()}
                raw_data = os.urandom(size * MiB)
                samples: dict[str, list[tuple[float, int]]] = {}
                for rep in range(args.repeats):
                    t0 = time.perf_counter()
                    for name, value in bench.repetition(state, reference, raw_data, rep, f"s{size}").items():
                        samples.setdefault(name, []).append(value)
                    print(f"  {size} MiB repetition {rep + 1}/{args.repeats}: {time.perf_counter() - t0:.1f}s",
                          file=sys.stderr, flush=True)
                result["sizes"].append(summarize(size, samples))
            if args.profile and state is not None:
                result["profile"] = bench.profile(state)
        finally:
            bench.close()
    result["fsspec_note"] = (
        "DCP FsspecWriter/FsspecReader via adlfs (connection_string; adlfs defaults: 50 MiB write "
        "blocks staged one at a time; sync_files=False)" if bench.fsspec else bench.fsspec_reason
    )
    result["wall_s"] = time.perf_counter() - started
    print(table(result))
    print(f"(wall {result['wall_s']:.0f}s; {result['machine']}; "
          f"azure-storage-blob {result['versions']['azure-storage-blob']}, adlfs {result['versions']['adlfs']})")
    if result.get("profile"):
        print(result["profile"])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
