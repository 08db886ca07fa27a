"""Where clusters and jobs run: one interface, one module per place, imported only when chosen.

``local``: real etcd, Azurite and torchrun processes on this machine.
AKS arrives as ``aks`` behind the same calls.
"""
import importlib
from pathlib import Path

_BACKENDS = {"local": "azext_elastictrain.core.backends.local:LocalBackend"}


def get_backend(name: str, state_root: Path):
    module, _, cls = _BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(state_root)
