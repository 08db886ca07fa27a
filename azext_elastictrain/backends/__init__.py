"""Where clusters and jobs run: one interface, one module per place, imported only when chosen.

``local``: real etcd, Azurite and torchrun processes on this machine.
``aks``: a cluster on Azure (AKS, storage, identity) through an ARM layer the caller gives it.
"""
import importlib

_BACKENDS = {
    "local": "azext_elastictrain.backends.local.cluster:LocalBackend",
    "aks": "azext_elastictrain.backends.aks.cluster:AksBackend",
}


def get_backend(name: str, *args, **kwargs):
    """``get_backend("local", state_root)``; ``get_backend("aks", arm_client, kube_connect=..., progress=...)``."""
    module, _, cls = _BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(*args, **kwargs)
