"""Arguments: names in the user's words, every one with help."""


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
