"""Where clusters and jobs run: one contract (``base.Backend``), one package per place, imported only when chosen.

``local``: real etcd, Azurite and torchrun processes on this machine.
``aks``: a cluster on Azure (AKS, storage, identity) through ARM, Kubernetes and blob clients given to it.
"""
import importlib

_BACKENDS = {
    "local": "azext_elastictrain.backends.local.backend:LocalBackend",
    "aks": "azext_elastictrain.backends.aks.backend:AksBackend",
}


def get_backend(name: str, *args, **kwargs):
    """``get_backend("local", state_root, cluster)``; ``get_backend("aks", arm, resource_group, cluster, ...)``:
    the backend's module is imported here, on first use, so loading the CLI imports none of them."""
    module, _, cls = _BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(*args, **kwargs)
