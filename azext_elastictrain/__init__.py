"""az elastictrain: elastic, fault-tolerant PyTorch training on Azure Spot GPUs.

Loading this module must stay cheap: the command table and arguments are
imported inside the loader's methods, and no SDK (azure.mgmt, azure.storage,
kubernetes, torch) is imported until a command runs.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

try:
    from azure.cli.core import AzCommandsLoader
except ImportError:  # inside a training job: only .runtime and .core are used, without az
    AzCommandsLoader = object
else:
    import_module("azext_elastictrain._help")  # fills knack's help table with ours


# azure-cli is not read by the type checker (mypy.ini): its loader is Any, and so a base class strict mode refuses
class ElasticTrainCommandsLoader(AzCommandsLoader):  # type: ignore[misc]
    def __init__(self, cli_ctx: Any = None) -> None:  # knack's CLI context
        # Each command group names its own operations module (commands.py).
        super().__init__(cli_ctx=cli_ctx)

    def load_command_table(self, args: list[str] | None) -> dict[str, Any]:
        from azext_elastictrain.commands import load_command_table

        load_command_table(self, args)
        table: dict[str, Any] = self.command_table  # name -> azure-cli's AzCliCommand
        return table

    def load_arguments(self, command: str) -> None:
        from azext_elastictrain._params import load_arguments

        load_arguments(self, command)


COMMAND_LOADER_CLS = ElasticTrainCommandsLoader
