"""Clusters on Azure: the create plan, show, list and delete, through an injectable ARM layer.

The plan is a list of steps, each able to ``check`` (GET: is it there and right?) and ``apply`` (PUT).
``create`` runs every step whose check fails, so a re-run after a failure half-way finishes the plan
and changes nothing that is already right; ``plan`` (dry run) builds every body without calling anything.

The ARM layer (``Arm``) is this module's one view of Azure: the CLI gives it one built on the SDK
clients (``azext_elastictrain.clients.arm``); tests give it the same against a local ARM server.
Kubernetes is reached through ``clients.kube`` and installed by ``backends.aks.incluster``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from azext_elastictrain.core import arm_bodies, preflight
from azext_elastictrain.core.errors import ArmError, ClusterNotFound
from azext_elastictrain.core.ports import Arm, KubeClient
from azext_elastictrain.core.spec import ENGINE_TORCHELASTIC, GPU_POOL, SYSTEM_POOL, ClusterSpec, unknown_location

#: Tries of a role assignment whose principal Entra ID does not know yet, with pauses of 2, 4, ... seconds between
#: them (azure-cli's AKS code: 10 tries, ``delay + delay * x``): at most 90 s of waiting in all.
if TYPE_CHECKING:
    from pathlib import Path

    from azext_elastictrain.backends.aks.session import AksSession
    from azext_elastictrain.core.manifests import InClusterSpec

ROLE_TRIES = 10
IN_PROGRESS = {"creating", "updating", "upgrading", "scaling", "deleting", "accepted", "resolvingdns",
               "starting", "stopping", "migrating", "canceling"}
_NO_WAIT_KINDS = ("cluster", "agent_pool")


class PlanFailed(Exception):
    """A step failed; ``done`` lists what this run completed before it. A re-run finishes the plan."""

    def __init__(self, step: str, error: ArmError | Exception, done: list[str]) -> None:
        super().__init__(f"{step}: {error}")
        self.step, self.error, self.done = step, error, done


KINDS = ("resource_group", "storage_account", "container", "identity", "cluster", "agent_pool",
         "maintenance_configuration", "federated_credential", "role_assignment")


@dataclass
class Step:
    """One resource of the plan. ``body`` is built when the step runs (it may need earlier results)."""

    title: str
    kind: str
    # a function where the name depends on an earlier result
    ref: "dict[str, Any] | Callable[[_Context], dict[str, Any]]"
    body: Callable[["_Context"], dict[str, Any]]
    long_running: bool = False
    compare: bool = True  # False: existing is enough (a resource group may hold more than ours)


@dataclass
class _Context:  # pylint: disable=too-many-instance-attributes  # what the plan's steps read, one field each
    spec: ClusterSpec
    subscription: str
    tenant: str
    found: dict[str, Any] = field(default_factory=dict)  # kind -> the resource as ARM returned it
    placeholders: bool = False  # dry run: values only Azure knows become "<...>"
    hardware: arm_bodies.NodeHardware = field(default_factory=arm_bodies.NodeHardware)  # from the region preflight
    admin: tuple[str, str | None] | None = None  # who gets the cluster's Kubernetes admin role (Entra ID only)
    creator: tuple[str, str | None] | None = None  # who gets the data role on the checkpoint container

    def identity(self, key: str) -> str:
        value = ((self.found.get("identity") or {}).get("properties") or {}).get(key)
        return value or f"<{key} of identity {self.spec.identity_name}>"

    def issuer(self) -> str:
        props = (self.found.get("cluster") or {}).get("properties") or {}
        return (props.get("oidcIssuerProfile") or {}).get("issuerURL") or \
            f"<OIDC issuer URL of cluster {self.spec.name}>"


def plan_steps(spec: ClusterSpec, subscription: str) -> list[Step]:
    """The create plan, in the order the resources depend on each other."""
    rg = spec.resource_group
    container_scope = arm_bodies.container_id(subscription, spec)
    cluster_scope = arm_bodies.cluster_id(subscription, spec)

    def role_ref(c: _Context) -> dict[str, Any]:
        return {"scope": container_scope,
                "name": arm_bodies.role_assignment_name(container_scope, c.identity("principalId"))}

    return [
        Step("resource group", "resource_group", {"resource_group": rg}, lambda c: arm_bodies.resource_group(c.spec),
             compare=False),
        Step("storage account", "storage_account", {"resource_group": rg, "name": spec.storage_account_name},
             lambda c: arm_bodies.storage_account(c.spec), long_running=True),
        Step("checkpoint container", "container",
             {"resource_group": rg, "account": spec.storage_account_name, "name": spec.container},
             lambda c: arm_bodies.blob_container(c.spec)),
        Step("managed identity", "identity", {"resource_group": rg, "name": spec.identity_name},
             lambda c: arm_bodies.user_assigned_identity(c.spec)),
        Step("AKS cluster", "cluster", {"resource_group": rg, "name": spec.name},
             lambda c: arm_bodies.managed_cluster(c.spec, c.hardware), long_running=True),
        Step("GPU Spot pool", "agent_pool", {"resource_group": rg, "cluster": spec.name, "name": GPU_POOL},
             lambda c: arm_bodies.gpu_agent_pool(c.spec, c.hardware), long_running=True),
        *[Step(title, "maintenance_configuration", {"resource_group": rg, "cluster": spec.name, "name": name},
               lambda c: arm_bodies.maintenance_window(c.spec)) for title, name in _maintenance(spec)],
        Step("federated credential", "federated_credential",
             {"resource_group": rg, "identity": spec.identity_name, "name": arm_bodies.federated_credential_name(spec)},
             lambda c: arm_bodies.federated_credential(c.spec, c.issuer())),
        Step("role assignment", "role_assignment", role_ref,
             lambda c: arm_bodies.role_assignment(c.subscription, c.identity("principalId"))),
    ] + ([] if spec.local_accounts else [
        Step("Kubernetes admin role", "role_assignment", lambda c: _admin_ref(c, cluster_scope),
             lambda c: arm_bodies.cluster_admin_assignment(c.subscription, *_principal(c.admin, "admin"))),
    ]) + [
        Step("your checkpoint access", "role_assignment", lambda c: _creator_ref(c, container_scope),
             lambda c: arm_bodies.checkpoint_access_assignment(c.subscription, *_principal(c.creator, "creator"))),
    ]


def _creator_ref(ctx: "_Context", scope: str) -> dict[str, Any]:
    principal = ctx.creator[0] if ctx.creator else ""
    return {"scope": scope, "name": arm_bodies.role_assignment_name(scope, principal, arm_bodies.CREATOR_DATA_ROLE)}


def _admin_ref(ctx: "_Context", scope: str) -> dict[str, Any]:
    principal = ctx.admin[0] if ctx.admin else ""
    return {"scope": scope,
            "name": arm_bodies.role_assignment_name(scope, principal, arm_bodies.AKS_RBAC_CLUSTER_ADMIN)}


def _maintenance(spec: ClusterSpec) -> list[tuple[str, str]]:
    """(step title, configuration name) of the windows --maintenance-window sets: node images always, Kubernetes
    upgrades where a channel upgrades it."""
    if not spec.maintenance_window:
        return []
    windows = [("node image upgrade window", arm_bodies.NODE_OS_MAINTENANCE)]
    if spec.upgrade_channel != "none":
        windows.append(("Kubernetes upgrade window", arm_bodies.AUTO_UPGRADE_MAINTENANCE))
    return windows


def _hardware(spec: ClusterSpec, checked: "preflight.PreflightResult | None") -> arm_bodies.NodeHardware:
    """The pools' OS disks and host encryption from the region's Resource SKUs; unknown without a preflight."""
    if checked is None:  # the sizes are not known: what was asked explicitly, and nothing else
        asked = preflight.PoolHardware(encryption_at_host=spec.encryption_at_host)
        return arm_bodies.NodeHardware(system=asked, gpu=asked)
    registered = checked.encryption_at_host_registered
    return arm_bodies.NodeHardware(
        system=preflight.pool_hardware(checked.system, spec.encryption_at_host, registered),
        gpu=preflight.pool_hardware(checked.gpu, spec.encryption_at_host, registered))


def _ref(step: Step, ctx: _Context) -> dict[str, Any]:
    return step.ref(ctx) if callable(step.ref) else step.ref


def _needs_location(spec: ClusterSpec) -> str:
    return spec.location or unknown_location(spec)


class AksClusters:  # pylint: disable=too-many-instance-attributes  # one command's clients and the waits' settings
    """Create, show, list and delete elastic-training clusters on AKS."""

    def __init__(self, arm_client: Arm, *, kube_connect: Callable[[bytes], KubeClient] | None = None,
                 progress: Callable[[str], None] | None = None, poll_seconds: float = 10.0,
                 poll_timeout: float = 3600.0, session: AksSession | None = None, rbac_wait: float = 300.0,
                 role_retry_seconds: float = 2.0, spot_market: Callable[[str, str],
                 dict[str, Any]] | None = None) -> None:
        self.arm = arm_client
        self._spot_market = spot_market  # (size, region) -> its prices and eviction band (clients.spot.offer)
        self.session = session  # the command's AksSession, when it has one
        self._kube_connect = kube_connect
        self._progress = progress or (lambda message: None)
        self._poll_seconds = poll_seconds
        self._poll_timeout = poll_timeout
        self._rbac_wait = rbac_wait
        self._role_retry_seconds = role_retry_seconds

    # ------------------------------------------------------------------ create

    def plan(self, spec: ClusterSpec) -> dict[str, Any]:
        """The whole plan, every ARM body and Kubernetes object, changing nothing: the region preflight's GETs
        where there is a login (an Arm without ``signed_in = False``), else the checks are skipped and the plan
        says so."""
        live_checks = getattr(self.arm, "signed_in", True)
        if live_checks:
            spec = self._before_writes(replace(spec, subscription=self.arm.subscription))
        elif not spec.storage_account:  # its 8 hex digits hash the subscription, unknown here: zeros stand in
            spec = replace(spec, storage_account=spec.storage_account_name[:-8] + "0" * 8)
        checked = self._preflight(spec) if live_checks else None
        spec = replace(spec, location=_needs_location(spec))
        ctx = _Context(spec, self.arm.subscription, self.arm.tenant, placeholders=True,
                       hardware=_hardware(spec, checked), admin=self._admin(spec, live_checks),
                       creator=self._creator(spec, live_checks))
        requests = []
        for step in plan_steps(spec, ctx.subscription):
            ref = _ref(step, ctx)
            requests.append({"step": step.title, "method": "PUT", "id": _resource_id(step.kind, ref, ctx),
                             "longRunning": step.long_running, "body": step.body(ctx)})
        incluster = self._incluster_spec(ctx)
        return {"dryRun": True, "name": spec.name, "resourceGroup": spec.resource_group,
                "preflight": {**checked.as_dict(), "hardware": {"system": ctx.hardware.system.as_dict(),
                                                                "gpu": ctx.hardware.gpu.as_dict()}} if checked
                else {"skipped": (_skipped(self.arm) if not live_checks else "the location is not known yet")
                      + "; OS disks and host encryption are left to AKS's defaults"},
                "arm": requests, "kubernetes": _kube_objects(incluster),
                "note": "Values in <...> are known once the step before creates them; in the Kubernetes "
                        f"objects the identity's client id is shown as {_ZERO_GUID}."
                        + ("" if live_checks else " Signed out, the default storage account name ends in 00000000: "
                           "its last 8 characters hash the subscription.")}

    def merge_kubeconfig(self, spec: ClusterSpec, path: Path | None = None) -> dict[str, Any]:
        """Write the cluster user's credentials into a kubeconfig file: only when the user asks."""
        from azext_elastictrain.core.kubeconfig import merge_into_file

        written, context = merge_into_file(self.arm.user_kubeconfig(spec.resource_group, spec.name), path)
        self._progress(f"Merged the credentials of {spec.name!r} into {written} (context {context!r})")
        return {"path": str(written), "context": context}

    def create(self, spec: ClusterSpec, *, no_wait: bool = False, install: bool = True) -> dict[str, Any]:
        """Run the plan: every step whose resource is missing or not right; stop at the first failure."""
        spec = self._before_writes(replace(spec, subscription=self.arm.subscription))
        checked = self._preflight(spec)  # before anything is created
        ctx = _Context(spec, self.arm.subscription, self.arm.tenant, hardware=_hardware(spec, checked),
                       admin=self._admin(spec, True), creator=self._creator(spec, True))
        done: list[str] = []
        changes: list[dict[str, Any]] = []
        steps = plan_steps(spec, ctx.subscription)
        for number, step in enumerate(steps, 1):
            title = f"[{number}/{len(steps) + 1}] {step.title}"
            try:
                if step.kind == "resource_group":
                    spec = ctx.spec = self._resource_group(step, ctx, changes, title)
                    done.append(step.title)
                    continue
                started = self._run_step(step, ctx, changes, title, no_wait)
            except ArmError as ex:
                raise PlanFailed(step.title, ex, done) from ex
            done.append(step.title)
            if started:  # --no-wait: later steps need this one finished
                pending = [s.title for s in steps[number:]] + ["Kubernetes components"]
                return self._summary(ctx, changes, pending=pending)
        title = f"[{len(steps) + 1}/{len(steps) + 1}] Kubernetes components"
        if install:
            try:
                operator = "operator, " if ctx.spec.engine == ENGINE_TORCHELASTIC else ""
                self._progress(f"{title}: installing etcd, {operator}device plugin")
                applied = self._install(ctx)
                changes.append({"step": "Kubernetes components", "action": _overall(applied),
                                "objects": applied})
            except ArmError as ex:
                raise PlanFailed("Kubernetes components", ex, done) from ex
            except Exception as ex:  # noqa: BLE001  a Kubernetes failure: report with what was done
                raise PlanFailed("Kubernetes components", ex, done) from ex
        return self._summary(ctx, changes)

    def _preflight(self, spec: ClusterSpec) -> "preflight.PreflightResult | None":
        """core.preflight against this region; a quota warning goes to progress, a size problem raises."""
        checked = preflight.run(self.arm, spec.gpu_vm_size, spec.max_count, spec.location, spec.resource_group,
                                system_vm_size=spec.system_vm_size, encryption_at_host=spec.encryption_at_host)
        if checked and self._spot_market:
            size = checked.gpu.name if checked.gpu else checked.gpu_vm_size  # as Resource SKUs spells it
            checked.spot_market = self._spot_market(size, checked.location)
            checked.warnings += preflight.spot_price_warnings(checked.spot_market, spec.spot_max_price)
            checked.warnings += preflight.spot_band_warnings(checked.spot_market)
            self._progress(preflight.spot_market_line(checked.spot_market))
        for warning in checked.warnings if checked else []:
            self._progress(warning)
        return checked

    def _before_writes(self, spec: ClusterSpec) -> ClusterSpec:
        """What must hold before the first write, read with GETs: a cluster that exists keeps the storage account
        and identity it recorded (one made before names were salted keeps its account), its pools' fields that
        AKS cannot change stay as they are, and the storage account name is free in all of Azure (or ours)."""
        rg = spec.resource_group
        found = self.arm.get("cluster", {"resource_group": rg, "name": spec.name})
        if found is not None:
            tags = found.get("tags") or {}
            spec = replace(spec, storage_account=spec.storage_account or tags.get(arm_bodies.TAG + "-storage") or "",
                           identity=spec.identity or tags.get(arm_bodies.TAG + "-identity") or "")
            _check_fixed_fields(spec, found)
        if self.arm.get("storage_account", {"resource_group": rg, "name": spec.storage_account_name}) is None:
            answer = self.arm.storage_name_available(spec.storage_account_name)
            if not answer.get("nameAvailable", True):
                raise preflight.storage_name_refused(spec.storage_account_name, answer,
                                                     chosen=bool(spec.storage_account))
        return spec

    def _creator(self, spec: ClusterSpec, signed_in: bool) -> tuple[str, str | None]:
        """Who reads the job's checkpoints and events with their own login (job show/list/wait, evict --wait,
        checkpoint ...): the principal that gets the Kubernetes admin role, local accounts or not."""
        if spec.admin_principal:
            return spec.admin_principal, None
        if not signed_in:
            return "<object id of the signed-in identity: az login>", None
        return self.arm.signed_in_principal()

    def _admin(self, spec: ClusterSpec, signed_in: bool) -> tuple[str, str | None] | None:
        """Who gets 'Azure Kubernetes Service RBAC Cluster Admin': --admin-principal, else the signed-in identity
        (its object id from the login's token); None where local accounts are on (no Entra ID)."""
        if spec.local_accounts:
            return None
        if spec.admin_principal:
            return spec.admin_principal, None
        if not signed_in:
            return "<object id of the signed-in identity: az login>", None
        return self.arm.signed_in_principal()

    def _resource_group(self, step: Step, ctx: _Context, changes: list[Any], title: str) -> ClusterSpec:
        ref = step.ref if isinstance(step.ref, dict) else step.ref(ctx)
        found = self.arm.get("resource_group", ref)
        spec = ctx.spec
        if found is None:
            if not spec.location:
                raise ArmError(404, "ResourceGroupNotFound",
                               f"resource group {spec.resource_group!r} does not exist; pass --location to create it")
            self._progress(f"{title} {spec.resource_group}: creating in {spec.location}")
            found = self.arm.put("resource_group", ref, arm_bodies.resource_group(spec))
            changes.append({"step": step.title, "action": "created"})
        else:
            changes.append({"step": step.title, "action": "unchanged"})
        ctx.found["resource_group"] = found
        return spec if spec.location else replace(spec, location=(found or {}).get("location", ""))

    def _run_step(self, step: Step, ctx: _Context, changes: list[Any], title: str, no_wait: bool) -> bool:
        """Check, then apply if needed. True when a long-running request was started and not awaited."""
        ref = _ref(step, ctx)
        found = self.arm.get(step.kind, ref)
        state = _provisioning_state(found)
        if state in IN_PROGRESS:
            if no_wait and step.kind in _NO_WAIT_KINDS:
                self._progress(f"{title}: {state} (already in progress)")
                changes.append({"step": step.title, "action": "in progress"})
                return True
            self._progress(f"{title}: waiting, it is {state}")
            found = self._await(step.kind, ref)
        body = arm_bodies.as_existing(step.body(ctx), found)
        wrong = arm_bodies.differences(body, found or {}) if found is not None else None
        if found is not None and state != "failed" and (not wrong or not step.compare):
            self._progress(f"{title}: already right")
            changes.append({"step": step.title, "action": "unchanged"})
            ctx.found[step.kind] = found
            return False
        action = "created" if found is None else "updated"
        detail = "" if found is None else f" ({', '.join(wrong or ['failed before'])})"
        # --no-wait skips the AKS waits (minutes); the storage account takes seconds and the container needs it
        wait = not (no_wait and step.kind in _NO_WAIT_KINDS)
        self._progress(f"{title}: {'creating' if found is None else 'updating'}{detail}"
                       + ("" if wait else ", not waiting (--no-wait)")
                       + (" - this takes several minutes" if step.long_running and wait else ""))
        if found is not None and step.kind in arm_bodies.MERGED_KINDS:
            body = arm_bodies.merged_update(body, found)  # GET -> merge ours -> PUT: what others set stays
        if step.kind == "role_assignment":
            result, action = self._assign_role(step, ref, body, title, action)
        else:
            result = self.arm.put(step.kind, ref, body, wait=wait)
        changes.append({"step": step.title, "action": action if wait else "started", **(
            {"fields": wrong} if wrong else {})})
        if not wait:
            return True
        if action == "already assigned":
            return False
        ctx.found[step.kind] = result if result is not None else self.arm.get(step.kind, ref)
        if _provisioning_state(ctx.found[step.kind]) == "failed":
            raise ArmError(500, "ProvisioningFailed", f"{step.title} ended in provisioning state Failed")
        return False

    def _assign_role(self, step: Step, ref: dict[str, Any], body: dict[str, Any], title: str,
                     action: str) -> tuple[dict[str, Any] | None, str]:
        """PUT a role assignment as azure-cli's AKS code does (acs/_roleassignments.py ``add_role_assignment``):
        409 ``RoleAssignmentExists`` - the principal already holds this role at this scope under another name
        (the portal, 'az role assignment create') - is done; ``PrincipalNotFound`` - an identity made moments ago
        that Entra ID has not replicated yet - is tried again with a growing pause, ``ROLE_TRIES`` times at most."""
        for attempt in range(ROLE_TRIES):
            try:
                return self.arm.put(step.kind, ref, body), action
            except ArmError as ex:
                if ex.status == 409 and ex.code == "RoleAssignmentExists":
                    self._progress(f"{title}: already assigned under another name: nothing to do")
                    return None, "already assigned"
                if ex.code != "PrincipalNotFound" or attempt == ROLE_TRIES - 1:
                    raise
                pause = self._role_retry_seconds * (attempt + 1)
                self._progress(f"{title}: Entra ID does not know the principal yet (it replicates new identities "
                               f"within minutes): trying again in {pause:g} s")
                time.sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover

    def _await(self, kind: str, ref: dict[str, Any]) -> dict[str, Any] | None:
        deadline = time.monotonic() + self._poll_timeout
        while True:
            found = self.arm.get(kind, ref)
            if _provisioning_state(found) not in IN_PROGRESS or time.monotonic() > deadline:
                return found
            time.sleep(self._poll_seconds)

    def _incluster_spec(self, ctx: _Context) -> InClusterSpec:
        from azext_elastictrain.core.manifests import InClusterSpec

        def guid(value: str) -> str:  # dry run: Azure assigns these ids; a zero GUID stands in for them
            return _ZERO_GUID if value.startswith("<") else value

        return InClusterSpec(namespace=ctx.spec.namespace, service_account=ctx.spec.service_account,
                             identity_client_id=guid(ctx.identity("clientId")),
                             tenant_id=guid(ctx.identity("tenantId")) if "identity" in ctx.found
                             else (ctx.tenant or None),
                             checkpoint_url=self._checkpoint_url(ctx.spec, ctx.found.get("storage_account")),
                             engine=ctx.spec.engine)

    def _checkpoint_url(self, spec: ClusterSpec, account: dict[str, Any] | None) -> str:
        return spec.checkpoint_url(arm_bodies.blob_endpoint(account, spec, self.arm.storage_suffix))

    def _kube(self, spec: ClusterSpec) -> KubeClient:
        """A Kubernetes client from the user credentials, which stay in memory: the command's session's where it
        is of this cluster (credentials fetched once per command)."""
        session = self.session
        if session is None or (session.resource_group, session.cluster) != (spec.resource_group, spec.name):
            from azext_elastictrain.backends.aks.session import AksSession

            session = AksSession(self.arm, spec.resource_group, spec.name, kube_connect=self._kube_connect,
                                 credential=self.session.credential if self.session else None)
        return session.kube()

    def _install(self, ctx: _Context) -> list[dict[str, Any]]:
        from azext_elastictrain.backends.aks import incluster

        from azext_elastictrain.clients.kube import KubeError

        # Azure documents up to 5 minutes before a new role assignment reaches the cluster's authorizer: a 403
        # right after the Kubernetes admin role was assigned is waited out, up to rbac_wait seconds.
        deadline = time.monotonic() + (self._rbac_wait if ctx.admin else 0)
        while True:
            try:
                return incluster.install(self._kube(ctx.spec), self._incluster_spec(ctx),
                                         progress=lambda line: self._progress(f"  {line}"))
            except KubeError as ex:
                if ex.status != 403 or time.monotonic() > deadline:
                    raise
                self._progress("  the Kubernetes admin role has not reached the cluster yet (Azure RBAC takes up "
                               "to 5 minutes): trying again")
                time.sleep(self._poll_seconds)

    def _summary(self, ctx: _Context, changes: list[Any], pending: list[str] | None = None) -> dict[str, Any]:
        if not pending:  # the GPU pool came after the cluster was read: read it again, pools and all
            ctx.found["cluster"] = self.arm.get("cluster", {"resource_group": ctx.spec.resource_group,
                                                            "name": ctx.spec.name})
        shown = self._describe(ctx.spec, ctx.found.get("cluster"), ctx, health=None)
        shown["changes"] = changes
        if pending:
            shown["pending"] = pending
            shown["next"] = (f"az elastictrain cluster wait -g {ctx.spec.resource_group} -n {ctx.spec.name} "
                             f"--created, then run the same create again to finish: {', '.join(pending)}")
            self._progress(f"Not waiting (--no-wait). Next: {shown['next']}")
        return shown

    # ------------------------------------------------------------------ show / list

    def show(self, spec: ClusterSpec, *, health: bool = True) -> dict[str, Any]:
        spec = replace(spec, subscription=spec.subscription or self.arm.subscription)
        ctx = _Context(spec, self.arm.subscription, self.arm.tenant)
        cluster = self.arm.get("cluster", {"resource_group": spec.resource_group, "name": spec.name})
        if cluster is None:
            raise ClusterNotFound(f"no AKS cluster named {spec.name!r} in resource group {spec.resource_group!r}")
        spec = ctx.spec = arm_bodies.spec_from_tags(spec, cluster)
        ctx.found["cluster"] = cluster
        for kind, ref in (("storage_account", {"resource_group": spec.resource_group,
                                               "name": spec.storage_account_name}),
                          ("identity", {"resource_group": spec.resource_group, "name": spec.identity_name})):
            ctx.found[kind] = self.arm.get(kind, ref)
        return self._describe(spec, cluster, ctx, health=health)

    def state(self, spec: ClusterSpec) -> dict[str, Any]:
        """What ``cluster wait`` polls: the cluster's provisioning state, Succeeded only once its pools are."""
        cluster = self.arm.get("cluster", {"resource_group": spec.resource_group, "name": spec.name})
        if cluster is None:
            raise ClusterNotFound(f"no AKS cluster named {spec.name!r} in resource group {spec.resource_group!r}")
        states = [_provisioning_state(cluster)] + [
            (p.get("provisioningState") or "").lower() for p in (cluster.get("properties") or {}).get(
                "agentPoolProfiles") or []]
        combined = next((s for s in states if s in IN_PROGRESS or s == "failed"), states[0])
        return {"name": spec.name, "resourceGroup": spec.resource_group, "provisioningState": combined.title()}

    def list(self, resource_group: str | None) -> list[dict[str, Any]]:
        rows = []
        for cluster in self.arm.list_clusters(resource_group):
            if arm_bodies.TAG not in (cluster.get("tags") or {}):
                continue  # not one of ours
            group = _resource_group_of(cluster.get("id", "")) or resource_group or ""
            spec = arm_bodies.spec_from_tags(ClusterSpec(name=cluster.get("name", ""), resource_group=group), cluster)
            rows.append(self._describe(spec, cluster, None, health=None))
        return rows

    def _describe(self, spec: ClusterSpec, cluster: dict[str, Any] | None, ctx: _Context | None,
                  health: bool | None) -> dict[str, Any]:
        cluster = cluster or {}
        props = cluster.get("properties") or {}
        found = ctx.found if ctx else {}
        account = found.get("storage_account")
        identity = found.get("identity")
        shown: dict[str, Any] = {
            "name": spec.name,
            "type": "aks",
            "resourceGroup": spec.resource_group,
            "location": cluster.get("location") or spec.location,
            "provisioningState": props.get("provisioningState"),
            "kubernetesVersion": props.get("currentKubernetesVersion") or props.get("kubernetesVersion"),
            "fqdn": props.get("fqdn"),
            "oidcIssuerUrl": (props.get("oidcIssuerProfile") or {}).get("issuerURL"),
            "workloadIdentity": ((props.get("securityProfile") or {}).get("workloadIdentity") or {}).get("enabled"),
            "upgrades": props.get("autoUpgradeProfile") or {},
            "apiServerAuthorizedIpRanges": (props.get("apiServerAccessProfile") or {}).get("authorizedIPRanges") or [],
            "entraId": bool((props.get("aadProfile") or {}).get("managed")),
            "azureRbac": bool((props.get("aadProfile") or {}).get("enableAzureRBAC")),
            "localAccounts": not props.get("disableLocalAccounts", False),
            "pools": [_pool(p) for p in props.get("agentPoolProfiles") or []],
            "storage": {"account": spec.storage_account_name, "container": spec.container,
                        "checkpointUrl": self._checkpoint_url(spec, account)},
            "identity": {"name": spec.identity_name},
            "engine": spec.engine,
        }
        if account:
            aprops = account.get("properties") or {}
            shown["storage"].update({key: aprops.get(key) for key in (
                "provisioningState", "minimumTlsVersion", "supportsHttpsTrafficOnly", "allowBlobPublicAccess",
                "allowSharedKeyAccess")})
            shown["storage"]["sku"] = (account.get("sku") or {}).get("name")
            shown["storage"]["networkDefaultAction"] = (aprops.get("networkAcls") or {}).get("defaultAction")
        if identity:
            iprops = identity.get("properties") or {}
            shown["identity"].update({"clientId": iprops.get("clientId"), "principalId": iprops.get("principalId")})
        if health and ctx:
            found = self._health(spec, ctx)
            shown["health"] = _HEALTH.get(found["state"], found["state"])
            shown["components"] = found["components"]
        return shown

    def _health(self, spec: ClusterSpec, ctx: _Context) -> dict[str, Any]:
        """incluster.health, or every component 'unknown' (with why) where the cluster cannot be asked."""
        def unknown(reason: str) -> dict[str, Any]:
            names = ("elasticjob-crd", "etcd", "operator", "nvidia-device-plugin") \
                if spec.engine == ENGINE_TORCHELASTIC else ("etcd", "nvidia-device-plugin")
            return {"state": "unknown", "components": {name: {"state": "unknown", "reason": reason}
                                                       for name in names}}

        if _provisioning_state(ctx.found.get("cluster")) in IN_PROGRESS:
            return unknown("the cluster is still being provisioned")
        try:
            from azext_elastictrain.backends.aks import incluster

            return incluster.health(self._kube(spec), self._incluster_spec(ctx))
        except Exception as ex:  # pylint: disable=broad-exception-caught  # show must still show the Azure side
            from azext_elastictrain.clients.kube import KubeError

            reason = str(ex) if isinstance(ex, (KubeError, ArmError)) else type(ex).__name__
            return unknown(f"the Kubernetes API did not answer: {reason}")

    # ------------------------------------------------------------------ delete

    def delete_plan(self, spec: ClusterSpec, *, delete_storage: bool = False) -> dict[str, Any]:
        """What delete would remove and keep, looked up with GETs only."""
        spec = replace(spec, subscription=spec.subscription or self.arm.subscription)
        rg = spec.resource_group
        cluster = self.arm.get("cluster", {"resource_group": rg, "name": spec.name})
        if cluster is not None:
            spec = arm_bodies.spec_from_tags(spec, cluster)
        container_scope = arm_bodies.container_id(self.arm.subscription, spec)
        identity = self.arm.get("identity", {"resource_group": rg, "name": spec.identity_name})
        items: list[tuple[str, str, dict[str, Any]]] = []
        if identity is not None:
            principal = (identity.get("properties") or {}).get("principalId", "")
            items.append(("role assignment", "role_assignment", {
                "scope": container_scope, "name": arm_bodies.role_assignment_name(container_scope, principal)}))
            items.append(("federated credential", "federated_credential", {
                "resource_group": rg, "identity": spec.identity_name,
                "name": arm_bodies.federated_credential_name(spec)}))
        if cluster is not None:
            items.append(("AKS cluster", "cluster", {"resource_group": rg, "name": spec.name}))
        if identity is not None:
            items.append(("managed identity", "identity", {"resource_group": rg, "name": spec.identity_name}))
        storage_ref = {"resource_group": rg, "name": spec.storage_account_name}
        account = self.arm.get("storage_account", storage_ref)
        kept = []
        if account is not None:
            if delete_storage:
                items.append(("storage account (with every checkpoint)", "storage_account", storage_ref))
            else:
                kept.append({"what": "storage account and its checkpoints", "id":
                             arm_bodies.storage_account_id(self.arm.subscription, spec)})
        if not items and not kept:
            raise ClusterNotFound(f"no AKS cluster named {spec.name!r} in resource group {rg!r}, "
                                  "nor its identity or storage")
        return {"name": spec.name, "resourceGroup": rg, "delete": [
            {"step": title, "kind": kind, "ref": ref, "id": _resource_id(kind, ref, None, self.arm.subscription)}
            for title, kind, ref in items], "keep": kept}

    def delete(self, plan: dict[str, Any], *, no_wait: bool = False) -> dict[str, Any]:
        deleted: list[dict[str, Any]] = []
        for item in plan["delete"]:
            self._progress(f"deleting {item['step']}" + (" - this takes several minutes" if item["kind"] == "cluster"
                                                         and not no_wait else ""))
            try:
                self.arm.delete(item["kind"], item["ref"], wait=not (no_wait and item["kind"] == "cluster"))
            except ArmError as ex:
                if ex.status != 404:
                    raise PlanFailed(f"delete {item['step']}", ex, [d["step"] for d in deleted]) from ex
            deleted.append({"step": item["step"], "id": item["id"]})
        return {"name": plan["name"], "resourceGroup": plan["resourceGroup"], "deleted": deleted,
                "kept": plan["keep"]}


_ZERO_GUID = "00000000-0000-0000-0000-000000000000"
_PREFLIGHT_SKIPPED = ("not logged in: the region checks (GPU size offered, Spot-capable, not restricted; Spot vCPU "
                      "quota) did not run; 'az login' and run the dry run again to have them")


def _skipped(arm_client: Arm) -> str:
    """Why a dry run planned signed out: no login, or a login whose token could not be had (and why)."""
    reason = getattr(arm_client, "signed_out_reason", None)
    if not reason:
        return _PREFLIGHT_SKIPPED
    return (f"the login's token could not be had ({reason}): the region checks and the storage name check did "
            "not run; 'az login' again and run the dry run again to have them")


#: Pool fields AKS takes only at creation and refuses to change on an existing pool (400 PropertyChangeNotAllowed):
#: (field, the option that sets it).
FIXED_POOL_FIELDS = (("vmSize", "--gpu-vm-size"), ("scaleSetPriority", None),
                     ("scaleSetEvictionPolicy", "--eviction-policy"), ("spotMaxPrice", "--max-price"))


def _check_fixed_fields(spec: ClusterSpec, cluster: dict[str, Any]) -> None:
    """A re-run asking to change what AKS cannot change on an existing pool: an error before any request that
    writes, naming what is there (AKS would refuse the PUT minutes into the create)."""
    from azext_elastictrain.core.errors import NotSupported

    pools = {str(p.get("name", "")).lower(): p for p in (cluster.get("properties") or {}).get("agentPoolProfiles")
             or []}
    changed = []
    gpu = pools.get(GPU_POOL)
    if gpu is not None:
        wanted = arm_bodies.gpu_agent_pool(spec)["properties"]
        changed += [(f"GPU pool {field}", option, gpu.get(field), wanted[field]) for field, option in FIXED_POOL_FIELDS
                    if gpu.get(field) is not None and not arm_bodies.same_value(wanted[field], gpu.get(field))]
    system = pools.get(SYSTEM_POOL)
    if system is not None and system.get("vmSize") and not arm_bodies.same_value(spec.system_vm_size, system["vmSize"]):
        changed.append(("system pool vmSize", "--node-vm-size", system["vmSize"], spec.system_vm_size))
    if changed:
        what = "; ".join(f"{name} is {have!r}, asked {want!r}" for name, _, have, want in changed)
        keep = " ".join(f"{option} {have}" for _, option, have, _ in changed if option)
        raise NotSupported(
            f"cluster {spec.name!r} exists and AKS cannot change a pool's size, priority, eviction policy or Spot "
            f"price after creating it: {what}. Nothing was changed.",
            recommendation=f"Run the create again with the values the cluster has ({keep}), or create another "
                           "cluster with -n NAME for the new ones.")


_HEALTH = {"ok": "Healthy", "degraded": "Degraded", "missing": "Missing", "unknown": "Unknown"}


def _kube_objects(incluster_spec: InClusterSpec) -> list[dict[str, Any]]:
    from azext_elastictrain.core.manifests import render_cluster_objects

    return render_cluster_objects(incluster_spec)


def _overall(applied: list[dict[str, Any]]) -> str:
    actions = {a.get("action") for a in applied}
    return "unchanged" if actions <= {"unchanged"} else "applied"


def _provisioning_state(resource: dict[str, Any] | None) -> str:
    if not resource:
        return ""
    props = resource.get("properties") or {}
    return str(props.get("provisioningState") or resource.get("provisioningState") or "").lower()


def _pool(profile: dict[str, Any]) -> dict[str, Any]:
    spot = (profile.get("scaleSetPriority") or "Regular") == "Spot"
    return {
        "name": profile.get("name"), "mode": profile.get("mode"), "vmSize": profile.get("vmSize"),
        "priority": profile.get("scaleSetPriority") or "Regular",
        "evictionPolicy": profile.get("scaleSetEvictionPolicy") if spot else None,
        "spotMaxPrice": profile.get("spotMaxPrice") if spot else None,
        "count": profile.get("count"), "minCount": profile.get("minCount"), "maxCount": profile.get("maxCount"),
        "autoscale": profile.get("enableAutoScaling"), "taints": profile.get("nodeTaints") or [],
        "labels": profile.get("nodeLabels") or {}, "provisioningState": profile.get("provisioningState"),
        "osDiskType": profile.get("osDiskType"), "encryptionAtHost": profile.get("enableEncryptionAtHost"),
    }


def _resource_group_of(resource_id: str) -> str:
    parts = resource_id.split("/")
    lowered = [p.lower() for p in parts]
    return parts[lowered.index("resourcegroups") + 1] if "resourcegroups" in lowered else ""


def _principal(who: tuple[str, str | None] | None, what: str) -> tuple[str, str | None]:
    """The (object id, principal type) the plan resolved before its role steps run."""
    if who is None:
        raise AssertionError(f"the plan runs a role step before it resolved the {what}")
    return who


def _resource_id(kind: str, ref: dict[str, Any], ctx: _Context | None, subscription: str = "") -> str:
    sub = ctx.subscription if ctx else subscription
    group = f"/subscriptions/{sub}/resourceGroups/{ref.get('resource_group', '')}"
    return {
        "resource_group": lambda: group,
        "storage_account": lambda: f"{group}/providers/Microsoft.Storage/storageAccounts/{ref.get('name')}",
        "container": lambda: (f"{group}/providers/Microsoft.Storage/storageAccounts/{ref.get('account')}"
                              f"/blobServices/default/containers/{ref.get('name')}"),
        "identity": lambda: f"{group}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/{ref.get('name')}",
        "cluster": lambda: f"{group}/providers/Microsoft.ContainerService/managedClusters/{ref.get('name')}",
        "agent_pool": lambda: (f"{group}/providers/Microsoft.ContainerService/managedClusters/{ref.get('cluster')}"
                               f"/agentPools/{ref.get('name')}"),
        "maintenance_configuration": lambda: (f"{group}/providers/Microsoft.ContainerService/managedClusters/"
                                              f"{ref.get('cluster')}/maintenanceConfigurations/{ref.get('name')}"),
        "federated_credential": lambda: (f"{group}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/"
                                         f"{ref.get('identity')}/federatedIdentityCredentials/{ref.get('name')}"),
        "role_assignment": lambda: f"{ref.get('scope')}/providers/Microsoft.Authorization/roleAssignments/"
                                   f"{ref.get('name')}",
    }[kind]()
