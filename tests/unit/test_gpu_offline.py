"""scripts/bench/gpu_offline.py's choice of wheels: what the runtime needs beside the GPU machine's own torch,
read off this environment's installed packages, for the target's Python."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "gpu_offline.py"


def offline() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_offline", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_wheels_are_the_runtimes_needs_without_torch_and_what_the_image_has() -> None:
    pytest.importorskip("torchft")
    module = offline()
    pins = module.closure(module.WANTED, set(module.SKIP), "3.12")
    assert {"torchft", "azure-storage-blob", "azure-core", "python-etcd"} <= set(pins)
    assert "opentelemetry-api" in pins, "torchft's own needs come along"
    assert not {"torch", "numpy", "triton"} & set(pins) and not any(n.startswith("nvidia-") for n in pins)
    assert all(pins.values()), "each at the version installed here"


def test_a_package_the_target_has_is_left_out_with_what_only_it_needed() -> None:
    pytest.importorskip("torchft")
    module = offline()
    pins = module.closure(["azure-storage-blob"], set(module.SKIP) | {"cryptography"}, "3.12")
    assert "cryptography" not in pins and "cffi" not in pins and "azure-core" in pins
