#!/usr/bin/env python3
"""scripts/bench/gpu.py on a GPU machine that reaches no package registry: pack here, run there.

    python3 scripts/bench/gpu_offline.py pack             # here, after `bash scripts/setup.sh` (~30 s, ~45 MB)
    python3 scripts/bench/gpu_offline.py run --json out/gpu.json    # there, from the checkout's root

A CUDA image with PyTorch has torch and little of the rest. ``pack`` writes into ``.bench/offline`` (git
ignores it) what gpu.py needs beside torch:

* ``wheels/``: the runtime's Python packages (torchft, azure-storage-blob, azure-identity, python-etcd and
  what they need), read off this checkout's .venv with their versions, downloaded for the target's Python
  (``--python-version``, 3.12 by default), binary only. torch, numpy and the packages every such image has
  (``--skip``) are left out: the image's own torch is the one measured.
* ``tools.tar.xz``: node, etcd, and the files of Azurite's blob service that it loads serving the runtime:
  node_modules is 360 MB, the blob service loads ~17 MB of it. Found by running gpu.py here on CPU with a tiny
  state through a node that records every module it loads (``require.cache``), so the list follows Azurite's
  version; each loaded package's package.json goes too (node reads them to resolve a package).

``run`` (on the GPU machine) unpacks the tools, installs the wheels into a scratch folder put first on
PYTHONPATH (nothing of the machine's Python is changed), points the harness at the unpacked etcd and Azurite
(ETCD_BIN, AZURITE_BIN), and runs gpu.py with the rest of its arguments. The memory tier's copies of a 19 GB
state (two slots) need ~40 GB of /dev/shm: with less free there and root, it mounts a tmpfs of its own in the
scratch folder (the machine's /dev/shm is left as it is) and passes it as ``--memory-dir``.
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACK = REPO / ".bench" / "offline"
WANTED = ["torchft", "azure-storage-blob", "azure-identity", "python-etcd", "xxhash", "psutil"]
# What a CUDA PyTorch image has, or what must be its own (torch and its CUDA libraries).
SKIP = ["torch", "triton", "numpy", "setuptools", "typing-extensions", "requests", "urllib3", "certifi", "idna",
        "charset-normalizer", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock", "fsspec", "zipp"]
PLATFORMS = ["manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
SHM_NEEDED = 45 * 2**30  # two slots of the 19 GB state, and room


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[ <>=!~;\[(]", requirement.strip(), maxsplit=1)[0]).lower()


def closure(wanted: list[str], skip: set[str], python_version: str) -> dict[str, str]:
    """``wanted`` and what it needs, each at the version this interpreter has installed (the .venv's)."""
    from packaging.markers import Marker

    env = {"python_version": python_version, "python_full_version": f"{python_version}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    found: dict[str, str] = {}
    todo = list(wanted)
    while todo:
        name = _name(todo.pop())
        if name in found or name in skip or name.startswith("nvidia-"):
            continue
        dist = metadata.distribution(name)
        found[name] = dist.version
        for requirement in dist.requires or []:
            marker = requirement.split(";", 1)[1] if ";" in requirement else None
            if marker is None or Marker(marker).evaluate(env):
                todo.append(requirement)
    return found


def download(pins: dict[str, str], into: Path, python_version: str) -> None:
    into.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    binary = [f"{n}=={v}" for n, v in sorted(pins.items()) if n != "python-etcd"]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(into),
                    *binary], check=True)
    if "python-etcd" in pins:  # an sdist only: made into a (pure Python) wheel here, so that there no build runs
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(into),
                        f"python-etcd=={pins['python-etcd']}"], check=True)


def azurite_files(node_modules: Path, work: Path) -> list[Path]:
    """The files of node_modules that Azurite's blob service loads while gpu.py (CPU, tiny) uses it."""
    loaded = work / "loaded.txt"
    recorder = work / "record.js"
    recorder.write_text("process.on('exit', () => require('fs').appendFileSync("
                        f"{json.dumps(str(loaded))}, Object.keys(require.cache).join('\\n') + '\\n'));\n")
    wrapper = work / "azurite-blob"
    main_js = node_modules / "azurite" / "dist" / "src" / "blob" / "main.js"
    wrapper.write_text(f'#!/bin/sh\nexec node -r "{recorder}" "{main_js}" "$@"\n')
    wrapper.chmod(0o755)
    subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / "gpu.py"), "--device", "cpu", "--tiny",
                    "--timeout", "170", "--memory-dir", str(work)], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "AZURITE_BIN": str(wrapper)}, timeout=200)
    files = {Path(line).resolve() for line in loaded.read_text().split() if line}
    root = node_modules.resolve()
    inside = sorted(f for f in files if f.is_relative_to(root))
    # Each package.json from a loaded file up to its package's root: a dual package's dist/commonjs holds one
    # of its own ("type": "commonjs") that decides how node reads the files below it.
    manifests = {folder / "package.json" for f in inside for folder in f.parents
                 if folder.is_relative_to(root) and folder != root and (folder / "package.json").exists()}
    return sorted(set(inside) | manifests)


def pack(args: argparse.Namespace) -> int:
    node, etcd = shutil.which("node"), os.environ.get("ETCD_BIN") or shutil.which("etcd")
    node_modules = REPO / ".tools" / "node_modules"
    if not node or not etcd or not (node_modules / "azurite").is_dir():
        print("pack: needs node, etcd and .tools/node_modules/azurite: run `bash scripts/setup.sh` first",
              file=sys.stderr)
        return 2
    shutil.rmtree(PACK, ignore_errors=True)
    pins = closure(WANTED, set(SKIP) | set(args.skip), args.python_version)
    download(pins, PACK / "wheels", args.python_version)
    with tempfile.TemporaryDirectory(prefix="gpu-offline-") as tmp:
        files = azurite_files(node_modules, Path(tmp))
    with tarfile.open(PACK / "tools.tar.xz", "w:xz", preset=6) as tar:
        tar.add(node, "bin/node")
        tar.add(etcd, "bin/etcd")
        for f in files:
            tar.add(f, str(Path("node_modules") / f.relative_to(node_modules.resolve())))
    (PACK / "pins.json").write_text(json.dumps(pins, indent=1, sort_keys=True))
    size = sum(f.stat().st_size for f in PACK.rglob("*") if f.is_file())
    print(f"pack: {PACK.relative_to(REPO)}: {len(pins)} wheels, node, etcd, {len(files)} of Azurite's files; "
          f"{size / 2**20:.1f} MiB")
    return 0


def memory_dir(scratch: Path, needed: int) -> str:
    """/dev/shm when it has ``needed`` bytes free, else a tmpfs of our own (root), else /dev/shm."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free >= needed:
        return str(shm)
    own = scratch / "shm"
    own.mkdir(exist_ok=True)
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64g", "tmpfs", str(own)],
                                            check=False).returncode == 0:
        return str(own)
    return str(shm)


def run(rest: list[str]) -> int:
    scratch = Path(os.environ.get("GPU_OFFLINE_DIR", tempfile.gettempdir())) / "gpu-offline"
    scratch.mkdir(parents=True, exist_ok=True)
    with tarfile.open(PACK / "tools.tar.xz") as tar:
        tar.extractall(scratch, filter="tar")
    site = scratch / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site),
                    *map(str, sorted((PACK / "wheels").glob("*.whl")))], check=True)
    wrapper = scratch / "azurite-blob"
    wrapper.write_text('#!/bin/sh\nhere="$(dirname "$0")"\n'
                       'exec "$here/bin/node" "$here/node_modules/azurite/dist/src/blob/main.js" "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]),
           "PATH": os.pathsep.join([str(scratch / "bin"), os.environ.get("PATH", "")]),
           "ETCD_BIN": str(scratch / "bin" / "etcd"), "AZURITE_BIN": str(wrapper), "PYTHONUNBUFFERED": "1"}
    if "--memory-dir" not in rest:
        rest = ["--memory-dir", memory_dir(scratch, 0 if "--tiny" in rest else SHM_NEEDED), *rest]
    return subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / "gpu.py"), *rest], env=env,
                          check=False).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    packing = sub.add_parser("pack", help="here: write .bench/offline")
    packing.add_argument("--python-version", default="3.12", help="the GPU machine's Python (3.12)")
    packing.add_argument("--skip", nargs="*", default=[], help="more packages the GPU machine has")
    sub.add_parser("run", help="there: unpack, install into a scratch folder, run gpu.py with the rest",
                   add_help=False)
    args, rest = parser.parse_known_args()
    return pack(args) if args.verb == "pack" else run(rest)


if __name__ == "__main__":
    sys.exit(main())
