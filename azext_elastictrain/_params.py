"""Arguments: names in the user's words, every one with help."""
from azure.cli.core.commands.parameters import get_three_state_flag


def load_arguments(self, _):
    with self.argument_context("elastictrain checkpoint") as c:
        c.argument(
            "url", options_list=["--url"],
            help="Blob URL of the job's checkpoint prefix: "
                 "https://<account>.blob.core.windows.net/<container>/<job>.",
        )
        c.argument(
            "connection_string", options_list=["--connection-string"],
            help="Storage connection string (local Azurite or development). Defaults to "
                 "AZURE_STORAGE_CONNECTION_STRING; without either, your az login is used (Entra ID).",
        )
        c.argument("step", type=int, options_list=["--step"], help="Training step of the checkpoint.")

    with self.argument_context("elastictrain checkpoint prune") as c:
        c.argument("keep_last", type=int, options_list=["--keep-last"],
                   help="Keep the newest N complete checkpoints; delete older complete ones.")
        c.argument("older_than", options_list=["--older-than"],
                   help="Delete complete checkpoints older than this: 90s, 30m, 12h, 7d, 2w.")
        c.argument("incomplete", arg_type=get_three_state_flag(), options_list=["--incomplete"],
                   help="Also delete incomplete or damaged checkpoints older than the newest complete one "
                        "and untouched for 10 minutes (abandoned saves).")
        c.argument("dry_run", arg_type=get_three_state_flag(), options_list=["--dry-run"],
                   help="Show what would be deleted and delete nothing.")
        c.argument("yes", arg_type=get_three_state_flag(), options_list=["--yes", "-y"],
                   help="Do not prompt for confirmation.")

    with self.argument_context("elastictrain cluster") as c:
        c.argument("local", arg_type=get_three_state_flag(), options_list=["--local"],
                   help="A cluster on this machine: real etcd, Azurite and a Scheduled Events endpoint.")
        c.argument("name", options_list=["--name", "-n"],
                   help="Name of the local cluster (default: local).")
    with self.argument_context("elastictrain cluster delete") as c:
        c.argument("dry_run", arg_type=get_three_state_flag(), options_list=["--dry-run"],
                   help="Show what would be stopped and removed; change nothing.")
        c.argument("yes", arg_type=get_three_state_flag(), options_list=["--yes", "-y"],
                   help="Do not prompt for confirmation.")
