"""-o table transformers: ordered rows, in the user's words.

Each takes a command's az output (JSON: ``dict[str, Any]``, or a list of them) and returns the table's rows.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

Json = dict[str, Any]  # one item of a command's output, as az prints it with -o json
Row = OrderedDict[str, Any]  # one row of the table, its columns in order


def _size(num: float | None) -> str:
    if num is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num) < 1024 or unit == "GiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return str(num)


def _verified(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "-"}[value]


def checkpoint_row(item: Json) -> Row:
    return OrderedDict([
        ("Step", item.get("step")),
        ("Status", item.get("status")),
        ("Created", item.get("created")),
        ("Size", _size(item.get("sizeBytes"))),
        ("Files", item.get("files")),
        ("WorldSize", item.get("worldSize") if item.get("worldSize") is not None else ""),
        ("Verified", _verified(item.get("verified"))),
        ("Problems", "; ".join(item.get("problems") or [])),
    ] + ([("Path", item["path"])] if item.get("path") else []))


def checkpoint_list_table(result: list[Json]) -> list[Row]:
    return [checkpoint_row(item) for item in result]


def checkpoint_show_table(result: Json) -> list[Row]:
    return [checkpoint_row(result)]


def checkpoint_prune_table(result: Json) -> list[Row]:
    action = "would delete" if result.get("dryRun") else ("deleted" if result.get("deleted") else "kept (declined)")
    return [
        OrderedDict([("Action", action), ("Step", c["step"]), ("Status", c["status"]),
                     ("Size", _size(c.get("sizeBytes"))), ("Reason", c.get("reason", ""))])
        for c in result.get("delete", [])
    ]


def _spot(pool: Json) -> str:
    if pool.get("priority") != "Spot":
        return pool.get("priority") or ""
    price = pool.get("spotMaxPrice")
    price = "on-demand cap" if price in (None, -1, -1.0) else f"max ${price:g}/h"
    return f"Spot, {pool.get('evictionPolicy')}, {price}"


def aks_cluster_row(item: Json) -> Row:
    """An AKS cluster: its state, the GPU Spot pool, and (from show) the health of each component."""
    pools = item.get("pools") or []
    gpu: Json = next((p for p in pools if p.get("mode") == "User"), {})
    components = item.get("components") or {}
    row = [("Name", item.get("name")), ("ResourceGroup", item.get("resourceGroup")),
           ("Location", item.get("location")), ("State", item.get("provisioningState"))]
    if "health" in item:
        row += [("Health", item.get("health"))] + [
            (title, (components.get(key) or {}).get("state", ""))
            for title, key in (("Etcd", "etcd"), ("Operator", "operator"), ("DevicePlugin", "nvidia-device-plugin"))]
    row += [("GpuSize", gpu.get("vmSize", "")), ("Priority", _spot(gpu) if gpu else ""),
            ("GpuNodes", f"{gpu.get('count')} ({gpu.get('minCount')}-{gpu.get('maxCount')})" if gpu else ""),
            ("Storage", (item.get("storage") or {}).get("account", ""))]
    return OrderedDict(row)


def cluster_row(item: Json) -> Row:
    if item.get("type") == "aks":
        return aks_cluster_row(item)
    components = item.get("components", {})
    return OrderedDict(
        [("Name", item.get("name")), ("Type", item.get("type")), ("Health", item.get("health"))]
        + [(key.title().replace("-", ""), (components.get(key) or {}).get("state", ""))
           for key in ("etcd", "azurite", "scheduled-events")]
        + [("Created", item.get("created"))]
    )


def cluster_show_table(result: Json) -> list[Row]:
    return [cluster_row(result)]


def cluster_list_table(result: list[Json]) -> list[Row]:
    return [cluster_row(item) for item in result]


def _number(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def job_row(item: Json) -> Row:
    nodes = item.get("nodes") or []
    checkpoint = item.get("lastCheckpointStep")
    return OrderedDict([
        ("Name", item.get("name")),
        ("State", item.get("state")),
        ("Nodes", f"{sum(1 for n in nodes if n.get('alive'))}/{len(nodes)}"),
        ("MinMax", f"{item.get('minNodes')}-{item.get('maxNodes')}"),
        ("Recovery", item.get("recovery") or ""),
        ("WorldSize", item.get("worldSize") if item.get("worldSize") is not None else ""),
        ("Step", item.get("step") if item.get("step") is not None else ""),
        ("SamplesPerSec", _number(item.get("samplesPerSecond"))),
        ("LastCheckpoint", checkpoint if checkpoint is not None else ""),
        ("Evictions", item.get("evictions", 0)),
        ("Recoveries", item.get("recoveries", 0)),
        ("Goodput", f"{item['goodput']:.1%}" if item.get("goodput") is not None else ""),
        ("Created", item.get("created")),
    ])


def _blank(value: object) -> object:
    return "" if value is None else value


def job_show_table(result: Json) -> list[Row]:
    row = job_row(result)
    cost = result.get("cost")
    if cost:  # on AKS, or asked for with --price-as
        row["Cost"] = _price(cost.get("cost"), 6) + ("" if cost.get("cost") == "unknown" else f" {cost['currency']}")
        row["SavedVsOnDemand"] = ("unknown" if isinstance(cost.get("savedPercent"), str)
                                  else f"{cost['savedPercent']:g}%")
    return [row]


def job_timeline_table(result: Json) -> list[Row]:
    """One row per world the job formed: its size, the steps it trained, when, the steps it lost and the outage
    after it (its last step to the next world's first)."""
    stops = result.get("stops") or []
    rows = []
    for i, world in enumerate(result.get("worlds") or []):
        steps = world.get("steps") or [[None, None]]
        stop = stops[i] if i < len(stops) else {}
        rows.append(OrderedDict([("World", i + 1), ("WorldSize", world.get("worldSize")),
                                 ("FromStep", world.get("fromStep")), ("ToStep", steps[-1][1]),
                                 ("StartSeconds", steps[0][0]), ("EndSeconds", steps[-1][0]),
                                 ("StepsLost", _blank(stop.get("stepsLost"))),
                                 ("OutageSeconds", _blank(stop.get("outageSeconds")))]))
    return rows


def job_list_table(result: list[Json]) -> list[Row]:
    return [job_row(item) for item in result]


def job_delete_table(result: Json) -> list[Row]:
    if result.get("type") == "aks":
        return aks_job_delete_table(result)
    action = "would stop" if result.get("dryRun") else "stopped"
    rows = [OrderedDict([("Action", action), ("Node", p.get("node") or "(worker)"), ("Pid", p.get("pid"))])
            for p in result.get("stopped", [])]
    rows.append(OrderedDict([("Action", "would remove" if result.get("dryRun") else "removed"),
                             ("Node", f"job {result.get('name')} state"), ("Pid", "")]))
    rows.append(OrderedDict([("Action", "checkpoints"), ("Node", result.get("checkpoints")), ("Pid", "")]))
    return rows


def aks_job_delete_table(result: Json) -> list[Row]:
    """The ElasticJob that goes, its worker pods with it, and the checkpoints that stay."""
    dry = result.get("dryRun")
    job = OrderedDict([("Action", "would delete" if dry else "deleted"), ("What", "ElasticJob"),
                       ("Name", result.get("name")), ("Node", "")])
    pods = [OrderedDict([("Action", "would stop" if dry else "stopping"), ("What", f"rank {p.get('rank')}"),
                         ("Name", p.get("pod")), ("Node", p.get("node") or "")]) for p in result.get("stopped", [])]
    pods += [OrderedDict([("Action", "would delete" if dry else "deleted"), ("What", f"coordinator {c.get('kind')}"),
                          ("Name", c.get("name")), ("Node", "")]) for c in result.get("coordinator") or []]
    pods += [OrderedDict([("Action", "would delete" if dry else "deleted"), ("What", f"workers' {g.get('kind')}"),
                          ("Name", g.get("name")), ("Node", "")]) for g in result.get("guards") or []]
    kept = OrderedDict([("Action", "keeps"), ("What", "checkpoints"), ("Name", result.get("checkpointUrl", "")),
                        ("Node", "")])
    return [job] + pods + [kept]


def eviction_table(result: Json) -> list[Row]:
    if "seed" in result or "schedule" in result:
        return schedule_table(result)
    if result.get("type") == "aks":
        return aks_eviction_table(result)
    recovery = (result.get("recovery") or [{}])[-1]
    back = result.get("capacityBack") or {}
    return [
        OrderedDict([
            ("Node", e["node"]), ("Notice", f"{e['noticeSeconds']:g}s" if e["noticeSeconds"] else "none"),
            ("Acknowledged",
             "" if e["acknowledgedAfterSeconds"] is None else f"after {e['acknowledgedAfterSeconds']}s"),
            ("OutageSeconds", _blank(recovery.get("outageSeconds"))), ("StepsLost", recovery.get("stepsLost", "")),
            ("ResumedFrom", recovery.get("resumedFromStep", "")),
            ("Replacement", ", ".join(r["node"] for r in result.get("replacements") or [])),
            ("FullSizeAfterSeconds", back.get("seconds", "")),
            ("JoinedToFullSizeSeconds", _blank(back.get("nodeJoinedToFullSizeSeconds"))),
            ("ScaleUpOutageSeconds", _blank(back.get("outageSeconds"))),
        ])
        for e in result.get("evictions", [])
    ] or [OrderedDict([("Node", n["node"]), ("Pid", n["pid"]), ("Action", "would evict")]) for n in result["nodes"]]


def schedule_table(result: Json) -> list[Row]:
    """An eviction schedule: one row per eviction, planned (dry run) or carried out, and the goodput after."""
    if "schedule" not in result:  # --dry-run: the plan
        return [OrderedDict([("Eviction", e["index"]), ("AtSeconds", e["atSeconds"]),
                             ("Notice", f"{e['noticeSeconds']:g}s" if e["noticeSeconds"] else "none"),
                             ("CapacityBackAfter", "" if e["replaceAfterSeconds"] is None
                              else f"{e['replaceAfterSeconds']:g}s")]) for e in result["evictions"]]
    rows = []
    for e in result["evictions"]:
        recovery, back = e.get("recovery") or {}, e.get("capacityBack") or {}
        rows.append(OrderedDict([
            ("Eviction", e["index"]), ("AtSeconds", e["atSeconds"]), ("Node", e.get("node") or ""),
            ("Notice", f"{e['noticeSeconds']:g}s" if e["noticeSeconds"] else "none"),
            ("OutageSeconds", _blank(recovery.get("outageSeconds"))), ("StepsLost", recovery.get("stepsLost", "")),
            ("FullSizeAfterSeconds", (back.get("fullSize") or {}).get("seconds", "")),
            ("Note", e.get("skipped") or recovery.get("error") or recovery.get("eventsError")
             or ("stopped" if recovery.get("stopped") else "")),
        ]))
    found = result.get("goodput") or {}
    rows.append(OrderedDict([("Eviction", "goodput"), ("AtSeconds", result.get("ranSeconds")), ("Node", ""),
                             ("Notice", ""), ("OutageSeconds", ""), ("StepsLost", found.get("stepsLost", "")),
                             ("FullSizeAfterSeconds", ""),
                             ("Note", f"{found['goodput']:.1%}" if found.get("goodput") is not None
                              else result.get("goodputError") or "unknown")]))
    return rows


def aks_eviction_table(result: Json) -> list[Row]:
    """Spot evictions on AKS (or, dry run, the plan): one row per node, the VMSS instance behind it, the ranks
    it hit and, with --wait, when it left and how the job recovered."""
    rows = []
    for item in result.get("evictions") or result.get("targets") or []:
        recovery = item.get("recovery") or {}
        rows.append(OrderedDict([
            ("Node", item.get("node")), ("Pool", item.get("pool")), ("Vmss", item.get("vmss")),
            ("InstanceId", item.get("instanceId")),
            ("State", item.get("state") or "would evict"),
            ("Ranks", ", ".join(str(r) for r in item.get("ranks") or [])),
            ("Pods", ", ".join(p.get("pod") or "" for p in item.get("pods") or [])),
            ("EvictedAt", item.get("evictedAt", "")),
            ("NodeGoneSeconds", recovery.get("nodeGoneSeconds", "")),
            ("OutageSeconds", _blank(recovery.get("outageSeconds"))),
            ("StepsLost", recovery.get("stepsLost", "")),
        ]))
    return rows


def _price(value: object, digits: int = 4) -> str:
    """A price (a number) to ``digits`` places; a text (why there is none: "unknown") as it is."""
    return value if isinstance(value, str) else f"{value:.{digits}f}"


def sku_list_table(result: list[Json]) -> list[Row]:
    """Where to run: one row per Spot-capable GPU size, cheapest per GPU first."""
    return [OrderedDict([
        ("Name", item.get("name")), ("GPUs", item.get("gpus")), ("vCPUs", item.get("vCPUs")),
        ("SpotPerHour", _price(item.get("spotPerHour"))), ("OnDemandPerHour", _price(item.get("onDemandPerHour"))),
        ("SpotPerGpuHour", _price(item.get("spotPerGpuHour"))),
        ("SpotSaving", item["spotSavingPercent"] if isinstance(item.get("spotSavingPercent"), str)
         else f"{item.get('spotSavingPercent'):g}%"),
        ("EvictionRate", item.get("evictionRate") if item.get("evictionRate") == "unknown"
         else f"{item.get('evictionRate')}%"),
        ("SpotNodesQuotaAllows", item.get("spotNodesQuotaAllows")), ("Currency", item.get("currency")),
    ]) for item in result]
