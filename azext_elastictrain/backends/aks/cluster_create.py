"""Creating a cluster on Azure: the create plan, its region preflight, and the steps that make it.

The plan is a list of steps, each able to ``check`` (GET: is it there and right?) and ``apply`` (PUT).
``create`` runs every step whose check fails, so a re-run after a failure half-way finishes the plan
and changes nothing that is already right; ``plan`` (dry run) builds every body without calling anything.
Before any write, the region preflight (core.aks.preflight) checks the sizes and quota, and a cluster that exists
keeps what AKS cannot change. Last, the Kubernetes components are installed (backends.aks.incluster).
What it shows when done is a cluster's show (cluster_show.py); what the steps share with show and delete:
cluster.py.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from azext_elastictrain.backends.aks.cluster import (
    _ZERO_GUID,
    IN_PROGRESS,
    ClusterClients,
    PlanFailed,
    _Context,
    _provisioning_state,
    _resource_id,
)
from azext_elastictrain.backends.aks.cluster_show import describe_cluster
from azext_elastictrain.backends.views import AksClusterCreated, CreateFollowUp, Kubeconfig
from azext_elastictrain.core.aks import arm_bodies, preflight
from azext_elastictrain.core.errors import ArmError
from azext_elastictrain.core.ports import Arm, KubeClient
from azext_elastictrain.core.spec import ENGINE_TORCHELASTIC, GPU_POOL, SYSTEM_POOL, ClusterSpec, unknown_location

if TYPE_CHECKING:
    from pathlib import Path

    from azext_elastictrain.backends.aks.session import AksSession
    from azext_elastictrain.core.aks.manifests import InClusterSpec

#: Tries of a role assignment whose principal Entra ID does not know yet, with pauses of 2, 4, ... seconds between
#: them (azure-cli's AKS code: 10 tries, ``delay + delay * x``): at most 90 s of waiting in all.
ROLE_TRIES = 10
_NO_WAIT_KINDS = ("cluster", "agent_pool")


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


class ClusterCreation(ClusterClients):  # pylint: disable=too-many-instance-attributes  # and the waits' settings
    """Create (or finish, or plan) an elastic-training cluster on AKS."""

    def __init__(self, arm_client: Arm, *, kube_connect: Callable[[bytes], KubeClient] | None = None,
                 progress: Callable[[str], None] | None = None, poll_seconds: float = 10.0,
                 poll_timeout: float = 3600.0, session: AksSession | None = None, rbac_wait: float = 300.0,
                 role_retry_seconds: float = 2.0, spot_market: Callable[[str, str],
                 dict[str, Any]] | None = None) -> None:
        super().__init__(arm_client, kube_connect=kube_connect, progress=progress, session=session)
        self._spot_market = spot_market  # (size, region) -> its prices and eviction band (clients.spot.offer)
        self._poll_seconds = poll_seconds
        self._poll_timeout = poll_timeout
        self._rbac_wait = rbac_wait
        self._role_retry_seconds = role_retry_seconds

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

    def merge_kubeconfig(self, spec: ClusterSpec, path: Path | None = None) -> Kubeconfig:
        """Write the cluster user's credentials into a kubeconfig file: only when the user asks."""
        from azext_elastictrain.core.aks.kubeconfig import merge_into_file

        written, context = merge_into_file(self.arm.user_kubeconfig(spec.resource_group, spec.name), path)
        self._progress(f"Merged the credentials of {spec.name!r} into {written} (context {context!r})")
        return {"path": str(written), "context": context}

    def create(self, spec: ClusterSpec, *, no_wait: bool = False, install: bool = True) -> AksClusterCreated:
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
        """core.aks.preflight against this region; a quota warning goes to progress, a size problem raises."""
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

    def _summary(self, ctx: _Context, changes: list[Any], pending: list[str] | None = None) -> AksClusterCreated:
        if not pending:  # the GPU pool came after the cluster was read: read it again, pools and all
            ctx.found["cluster"] = self.arm.get("cluster", {"resource_group": ctx.spec.resource_group,
                                                            "name": ctx.spec.name})
        shown = describe_cluster(ctx.spec, ctx.found.get("cluster"), ctx.found,
                                 self._checkpoint_url(ctx.spec, ctx.found.get("storage_account")))
        follow_up = CreateFollowUp()
        if pending:
            wait = f"az elastictrain cluster wait -g {ctx.spec.resource_group} -n {ctx.spec.name} --created"
            follow_up = CreateFollowUp(
                pending=pending, next=f"{wait}, then run the same create again to finish: {', '.join(pending)}")
            self._progress(f"Not waiting (--no-wait). Next: {follow_up['next']}")
        return {**shown, "changes": changes, **follow_up}


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


def _kube_objects(incluster_spec: InClusterSpec) -> list[dict[str, Any]]:
    from azext_elastictrain.core.aks.manifests import render_cluster_objects

    return render_cluster_objects(incluster_spec)


def _overall(applied: list[dict[str, Any]]) -> str:
    actions = {a.get("action") for a in applied}
    return "unchanged" if actions <= {"unchanged"} else "applied"


def _principal(who: tuple[str, str | None] | None, what: str) -> tuple[str, str | None]:
    """The (object id, principal type) the plan resolved before its role steps run."""
    if who is None:
        raise AssertionError(f"the plan runs a role step before it resolved the {what}")
    return who
