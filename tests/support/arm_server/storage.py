"""The ARM test server's Microsoft.Storage names (checkNameAvailability)."""
from __future__ import annotations

import re
from typing import Any

from tests.support.arm_server.routes import _TYPE


class StorageFront:  # pylint: disable=too-few-public-methods
    """Storage account names: one namespace for the whole cloud.
    A part of ArmServer: its state is the server's."""

    def _storage_name_holder(self, name: str) -> str | None:
        """The id of the account holding ``name`` anywhere (this server's subscriptions), or "elsewhere"."""
        if name.lower() in self.taken_storage_names:
            return "elsewhere"
        return next((rid for rid, r in self.resources.items() if r["type"] == _TYPE["storage_account"]
                     and r["name"].lower() == name.lower()), None)

    def _storage_name(self, method: str, path: str, body: Any) -> tuple[int, dict, Any]:
        """StorageAccounts_CheckNameAvailability (POST, StorageAccountCheckNameAvailability.json): names are unique
        across Azure, so one held by any subscription - ours included - is not available."""
        if method != "POST":
            return self._violation(f"{method} {path}: checkNameAvailability is a POST")
        kind = "Microsoft.Storage/storageAccounts"
        if not isinstance(body, dict) or body.get("type") != kind or not body.get("name"):
            return self._violation(f"POST {path}: body {body!r} is not {{name, type: {kind}}}")
        name = str(body["name"])
        if not re.fullmatch(r"[a-z0-9]{3,24}", name):
            return 200, {}, {"nameAvailable": False, "reason": "AccountNameInvalid",
                             "message": f"{name} is not a valid storage account name. Storage account name must be "
                                        "between 3 and 24 characters in length and use numbers and lower-case "
                                        "letters only."}
        if self._storage_name_holder(name):
            return 200, {}, {"nameAvailable": False, "reason": "AlreadyExists",
                             "message": f"The storage account named {name} is already taken."}
        return 200, {}, {"nameAvailable": True}
