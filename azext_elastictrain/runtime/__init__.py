"""The training runtime: what training scripts import inside the job.

    from azext_elastictrain.runtime import Checkpointer, ElasticSampler, TrainingState, collective_timeout

torch is imported on first use of these names, not when this package loads.
"""
from typing import Any

_EXPORTS = {
    "Checkpointer": "azext_elastictrain.runtime.checkpoint",
    "CheckpointError": "azext_elastictrain.runtime.checkpoint",
    "FencedError": "azext_elastictrain.runtime.checkpoint",
    "TrainingState": "azext_elastictrain.runtime.state",
    "PreemptionWatcher": "azext_elastictrain.runtime.preemption",
    "ElasticSampler": "azext_elastictrain.runtime.data",
    "TrainingStopped": "azext_elastictrain.runtime.stopping",
    "collective_timeout": "azext_elastictrain.runtime.timeouts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
