"""az elastictrain: elastic, fault-tolerant PyTorch training on Azure Spot GPUs.

Loading this module must stay cheap: the command table and arguments are
imported inside the loader's methods, and no SDK (azure.mgmt, azure.storage,
kubernetes, torch) is imported until a command runs.
"""
from importlib import import_module

try:
    from azure.cli.core import AzCommandsLoader
except ImportError:  # inside a training job: only .runtime and .core are used, without az
    AzCommandsLoader = object  # type: ignore[assignment,misc]
else:
    import_module("azext_elastictrain._help")  # fills knack's help table with ours


class ElasticTrainCommandsLoader(AzCommandsLoader):  # type: ignore[misc,valid-type]
    def __init__(self, cli_ctx=None):
        # Each command group names its own operations module (commands.py).
        super().__init__(cli_ctx=cli_ctx)

    def load_command_table(self, args):
        from azext_elastictrain.commands import load_command_table

        load_command_table(self, args)
        return self.command_table

    def load_arguments(self, command):
        from azext_elastictrain._params import load_arguments

        load_arguments(self, command)


COMMAND_LOADER_CLS = ElasticTrainCommandsLoader
