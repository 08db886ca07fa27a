"""The command table: one CliCommandType per group, each with its own module."""
from __future__ import annotations

from typing import TYPE_CHECKING

from azure.cli.core.commands import CliCommandType

from azext_elastictrain._format import (
    checkpoint_list_table,
    checkpoint_prune_table,
    checkpoint_show_table,
    cluster_list_table,
    cluster_show_table,
    eviction_table,
    job_delete_table,
    job_list_table,
    job_show_table,
    job_timeline_table,
    sku_list_table,
)

if TYPE_CHECKING:
    from azext_elastictrain import ElasticTrainCommandsLoader


def load_command_table(loader: ElasticTrainCommandsLoader, _: list[str] | None) -> None:
    cluster_ops = CliCommandType(operations_tmpl="azext_elastictrain.operations.cluster#{}")
    with loader.command_group("elastictrain cluster", custom_command_type=cluster_ops, is_preview=True) as g:
        g.custom_command("create", "create_cluster", table_transformer=cluster_show_table, supports_no_wait=True)
        g.custom_show_command("show", "show_cluster", table_transformer=cluster_show_table)
        g.custom_command("list", "list_clusters", table_transformer=cluster_list_table)
        g.custom_command("delete", "delete_cluster", supports_no_wait=True)
        g.custom_wait_command("wait", "cluster_state")

    evict_ops = CliCommandType(operations_tmpl="azext_elastictrain.operations.evict#{}")
    with loader.command_group("elastictrain evict", custom_command_type=evict_ops, is_preview=True) as g:
        g.custom_command("simulate", "simulate_eviction", table_transformer=eviction_table)

    checkpoint_ops = CliCommandType(operations_tmpl="azext_elastictrain.operations.checkpoint#{}")

    with loader.command_group("elastictrain checkpoint", custom_command_type=checkpoint_ops, is_preview=True) as g:
        g.custom_command("list", "list_checkpoints", table_transformer=checkpoint_list_table)
        g.custom_show_command("show", "show_checkpoint", table_transformer=checkpoint_show_table)
        g.custom_command("verify", "verify_checkpoints", table_transformer=checkpoint_list_table)
        g.custom_command("prune", "prune_checkpoints", table_transformer=checkpoint_prune_table)
        g.custom_command("download", "download_checkpoint", table_transformer=checkpoint_show_table)

    job_ops = CliCommandType(operations_tmpl="azext_elastictrain.operations.job#{}")
    with loader.command_group("elastictrain job", custom_command_type=job_ops, is_preview=True) as g:
        g.custom_command("run", "run_job", table_transformer=job_show_table)
        g.custom_command("list", "list_jobs", table_transformer=job_list_table)
        g.custom_show_command("show", "show_job", table_transformer=job_show_table)
        g.custom_command("logs", "job_logs")
        g.custom_command("wait", "wait_job", table_transformer=job_show_table)
        g.custom_command("timeline", "job_timeline", table_transformer=job_timeline_table)
        g.custom_command("delete", "delete_job", table_transformer=job_delete_table)

    sku_ops = CliCommandType(operations_tmpl="azext_elastictrain.operations.sku#{}")
    with loader.command_group("elastictrain sku", custom_command_type=sku_ops, is_preview=True) as g:
        g.custom_command("list", "list_skus", table_transformer=sku_list_table)
