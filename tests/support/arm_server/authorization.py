"""The ARM test server's Microsoft.Authorization role assignments."""
from __future__ import annotations

import uuid

from tests.support.arm_server.identity import BLOB_DATA_ROLES, TENANT
from tests.support.arm_server.routes import _TYPE


class AuthorizationFront:  # pylint: disable=too-few-public-methods
    """Role assignments: who may assign what, and the data roles a principal holds.
    A part of ArmServer: its state is the server's."""

    def _role_refusal(self, rid: str, body: dict) -> tuple[int, str, str] | None:
        """What ARM answers a role assignment PUT it will not take: 409 RoleAssignmentExists where the principal
        holds the role at that scope under another name (azure-cli's AKS code counts it as done:
        acs/_roleassignments.py), 400 PrincipalNotFound while Entra ID has not replicated a new principal."""
        props = body.get("properties") or {}
        scope, _, name = rid.partition("/providers/Microsoft.Authorization/roleAssignments/")
        principal = str(props.get("principalId", ""))
        if self.principal_unknown.get(principal, 0) > 0:
            self.principal_unknown[principal] -= 1
            return 400, "PrincipalNotFound", (
                f"Principal {principal.replace('-', '')} does not exist in the directory {TENANT}. Check that you "
                "have the correct principal ID. If you are creating this principal and then immediately assigning "
                "a role, this error might be related to a replication delay. In this case, set the role assignment "
                "principalType property to a value, such as ServicePrincipal, User, or Group. See "
                "https://aka.ms/docs-principaltype")
        for key, found in self.resources.items():
            there = found.get("properties") or {}
            if (found["type"] == _TYPE["role_assignment"] and found["name"].lower() != name.lower()
                    and str(there.get("scope", "")).lower() == scope.lower()
                    and str(there.get("roleDefinitionId", "")).lower() == str(props.get("roleDefinitionId")).lower()
                    and str(there.get("principalId", "")).lower() == principal.lower()):
                return 409, "RoleAssignmentExists", "The role assignment already exists."
        return None

    def assign_role(self, scope: str, principal: str, role: str, name: str | None = None) -> str:
        """A role assignment made outside this tool (the portal, 'az role assignment create': a random name).
        Returns its id."""
        rid = f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name or uuid.uuid4()}"
        subscription = scope.split("/")[2]
        with self._lock:
            self.resources[rid.lower()] = {
                "id": rid, "name": rid.rsplit("/", 1)[1], "type": _TYPE["role_assignment"],
                "properties": {"scope": scope, "principalId": principal, "principalType": "ServicePrincipal",
                               "roleDefinitionId": f"/subscriptions/{subscription}/providers/Microsoft.Authorization/"
                                                   f"roleDefinitions/{role}"}}
        return rid

    def data_roles(self, principal: str, account: str, container: str) -> set[str]:
        """The built-in blob data roles ``principal`` holds on ``container`` of storage account ``account``: those
        assigned at the container, the account, its resource group or subscription (Azure RBAC inherits down)."""
        with self._lock:
            account_id = next((r["id"] for r in self.resources.values() if r["type"] == _TYPE["storage_account"]
                               and r["name"].lower() == account.lower()), None)
            if account_id is None:
                return set()
            target = f"{account_id}/blobServices/default/containers/{container}".lower()
            roles = set()
            for found in self.resources.values():
                props = found.get("properties") or {}
                scope = str(props.get("scope", "")).lower()
                if (found["type"] == _TYPE["role_assignment"] and str(props.get("principalId", "")).lower()
                        == principal.lower() and (target == scope or target.startswith(scope + "/"))):
                    role = str(props.get("roleDefinitionId", "")).rsplit("/", 1)[1].lower()
                    if role in BLOB_DATA_ROLES:
                        roles.add(role)
            return roles
