"""Spot economics, pure: hourly prices from Azure's Retail Prices API answers, eviction-rate bands from Resource
Graph's ``SpotResources`` rows, and what a job's node-hours cost. No network, no clock, no SDK: the callers
(``clients.prices``, ``clients.arm``) fetch and pass the answers here.

**Retail Prices** (https://learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices): a public
GET on ``https://prices.azure.com/api/retail/prices`` with an OData ``$filter``; an answer is ``{"BillingCurrency",
"CustomerEntityId", "CustomerEntityType", "Items": [...], "NextPageLink", "Count"}``, at most 100 items a page, the
next page at ``NextPageLink`` (null on the last). An item is one meter: ``armSkuName``, ``armRegionName``,
``retailPrice``, ``unitOfMeasure`` ("1 Hour"), ``type`` ("Consumption", "Reservation", "DevTestConsumption"),
``meterName``/``skuName`` (e.g. "NC4as T4 v3", "NC4as T4 v3 Spot", "NC4as T4 v3 Low Priority"), ``productName``
(e.g. "Virtual Machines NCasT4_v3 Series Windows"). A filter on the size and region alone also returns the Windows
meters, the retired Low Priority meters, reservations, dev/test prices, the classic Cloud Services meters
(``productName`` "NCasT4_v3 Series Cloud Services": the same ``armSkuName`` and service, another product, a
Windows-like rate) and $0 placeholder meters of sizes not yet priced (mattrobinsonsre/terrapod#932 met both pricing
every size): each one would be a wrong price, so ``hourly_prices`` keeps the Linux consumption meters of the
"Virtual Machines ..." products by the hour with a price above zero only, Spot where ``Spot`` is in the meter's name.
Filter values are case-sensitive (the API's page, "Filter values are case-sensitive"): ``retail_filter`` spells the
size as Resource SKUs does (``arm_size_name``).

**Eviction rates** (Resource Graph, table ``SpotResources``, type ``microsoft.compute/skuspotevictionrate/
location``): one row per size and region with ``properties.evictionRate``, a band of the share of Spot VMs of the
size evicted in the last 28 days: "0-5", "5-10", "10-15", "15-20", "20+" (percent).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

#: The Retail Prices API's endpoint; ``ELASTICTRAIN_PRICES_URL`` replaces it (a local front in tests).
RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
PRICES_URL_ENV = "ELASTICTRAIN_PRICES_URL"
#: The currencies the Retail Prices API documents (section "Supported currencies"); USD is Azure's own.
CURRENCIES = ("USD", "AUD", "BRL", "CAD", "CHF", "CNY", "DKK", "EUR", "GBP", "INR", "JPY", "KRW", "NOK", "NZD",
              "RUB", "SEK", "TWD")
DEFAULT_CURRENCY = "USD"
#: A price is kept this long in the cache (Azure changes Spot prices at most a few times a day).
CACHE_SECONDS = 24 * 3600
#: The most pages one size's meters are read through (a size has a few dozen meters: 1 page in practice).
MAX_PAGES = 10
UNKNOWN = "unknown"
#: The bands Resource Graph reports, lowest first (how ``sku list`` orders them).
EVICTION_BANDS = ("0-5", "5-10", "10-15", "15-20", "20+")
EVICTION_RATE_TYPE = "microsoft.compute/skuspotevictionrate/location"
SPOT_PRICE_HISTORY_TYPE = "microsoft.compute/skuspotpricehistory/ostype/location"


class CurrencyError(ValueError):
    """A currency the Retail Prices API does not price in: ``recommendation`` names those it does."""

    def __init__(self, currency: str) -> None:
        super().__init__(f"currency {currency!r} is not one the Azure Retail Prices API prices in")
        self.recommendation = "Pass one of: " + ", ".join(CURRENCIES) + " (default USD)."


def currency_code(currency: str | None) -> str:
    """The ISO code to ask for (upper case); ``CurrencyError`` for one the API does not support."""
    code = (currency or DEFAULT_CURRENCY).strip().upper()
    if code not in CURRENCIES:
        raise CurrencyError(currency or "")
    return code


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"  # OData: a quote inside a string literal is doubled


def retail_filter(size: str, region: str) -> str:
    """The ``$filter`` of one size's Virtual Machines meters in one region (the API compares values exactly
    since api-version 2023-01-01-preview, so the size is sent as ARM spells it, the region in lower case)."""
    return (f"serviceName eq 'Virtual Machines' and armRegionName eq {_quoted(region.lower())} and "
            f"armSkuName eq {_quoted(arm_size_name(size))} and priceType eq 'Consumption'")


_SIZE_HEAD = re.compile(r"(?P<family>[a-z]+)(?P<rest>\d.*)?", re.IGNORECASE)


def arm_size_name(size: str) -> str:
    """``size`` spelled as Resource SKUs and the price API's ``armSkuName`` spell it, whatever case it was typed in:
    "standard_nc4as_t4_v3" -> "Standard_NC4as_T4_v3". The naming convention of Azure's VM sizes page ("Virtual
    machine sizes naming conventions"): ``<Tier>_<Family><vCPUs>[-<constrained>]<additive features>[_<accelerator>]
    [_v<version>]``; the tier capitalised ("Standard", "Basic"), the family letters and the accelerator in upper case
    ("NC", "DS", "T4", "A100", "MI300X"), the additive features and the version in lower case ("as", "isr", "v5"),
    a trailing word capitalised ("Promo").
    Every size of the ARM front's Resource SKUs (the official examples' and the GPU sizes) round-trips
    (tests/unit/test_prices.py). A name that is not of this shape is sent as typed."""
    parts = size.strip().split("_")
    if len(parts) < 2 or not parts[0].isalpha():
        return size.strip()
    head = _SIZE_HEAD.fullmatch(parts[1])
    if not head:
        return size.strip()
    rest = head["rest"] or ""
    spelled = [parts[0].capitalize(), head["family"].upper() + rest.lower()]
    for part in parts[2:]:
        if re.fullmatch(r"v\d{1,2}", part, re.IGNORECASE):  # a version; "V620" is an accelerator
            spelled.append(part.lower())
        else:  # an accelerator ("T4", "MI300X") has a digit; a word ("Promo") is capitalised
            spelled.append(part.upper() if any(c.isdigit() for c in part) else part.capitalize())
    return "_".join(spelled)


@dataclass(frozen=True)
class HourlyPrice:
    """A size's price per hour in a region: None where the API has no such meter (or could not be asked)."""

    size: str
    region: str
    currency: str
    spot: float | None
    on_demand: float | None
    error: str | None = None  # why the price is unknown (unreachable, an error status); None when asked

    def as_dict(self) -> dict[str, Any]:
        shown = {"vmSize": self.size, "location": self.region, "currency": self.currency,
                 "spotPerHour": _or_unknown(self.spot), "onDemandPerHour": _or_unknown(self.on_demand)}
        if self.error:
            shown["priceError"] = self.error
        return shown


def _or_unknown(value: float | None) -> float | str:
    return UNKNOWN if value is None else value


def _is_linux_hourly_consumption(item: dict[str, Any]) -> bool:
    names = " ".join(str(item.get(k) or "") for k in ("productName", "skuName", "meterName"))
    return (str(item.get("type", "")).lower() == "consumption"
            and str(item.get("unitOfMeasure", "")).lower() == "1 hour"
            and str(item.get("productName") or "").lower().startswith("virtual machines ")  # not Cloud Services
            and "windows" not in names.lower() and "low priority" not in names.lower()
            and "cloud services" not in names.lower()
            and _float(item.get("tierMinimumUnits"), 0.0) == 0 and _float(item.get("retailPrice"), 0.0) > 0)


def _float(value: Any, default: float) -> float:
    try:
        return float(value if value is not None else default)
    except (TypeError, ValueError):
        return default


def _is_spot(item: dict[str, Any]) -> bool:
    return any("spot" in str(item.get(k) or "").lower().split() for k in ("meterName", "skuName"))


def hourly_prices(items: list[dict[str, Any]], size: str, region: str, currency: str) -> HourlyPrice:
    """The Spot and on-demand (pay-as-you-go) Linux price of ``size`` in ``region`` from the API's items: the
    newest meter of each by ``effectiveStartDate``; None where there is none."""
    mine = [i for i in items if isinstance(i, dict) and str(i.get("armSkuName", "")).lower() == size.lower()
            and str(i.get("armRegionName", "")).lower() == region.lower() and _is_linux_hourly_consumption(i)]
    spot = [i for i in mine if _is_spot(i)]
    regular = [i for i in mine if not _is_spot(i)]
    return HourlyPrice(arm_size_name(size), region.lower(), currency, _newest(spot), _newest(regular))


def _newest(items: list[dict[str, Any]]) -> float | None:
    if not items:
        return None
    item = max(items, key=lambda i: str(i.get("effectiveStartDate") or ""))
    try:
        return float(item["retailPrice"])
    except (KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------- eviction rates (Resource Graph)

def _names(values: list[str]) -> str:
    return ", ".join(_quoted(v.lower()) for v in values)


def eviction_rate_query(sizes: list[str], region: str) -> str:
    """The Resource Graph query for the eviction-rate band of each size in ``region``."""
    return (f"SpotResources | where type =~ '{EVICTION_RATE_TYPE}' | where location =~ {_quoted(region.lower())} "
            f"| where sku.name in~ ({_names(sizes)}) "
            "| project skuName = tostring(sku.name), location, evictionRate = tostring(properties.evictionRate)")


def spot_price_history_query(sizes: list[str], region: str) -> str:
    """The Resource Graph query for the latest Linux Spot price (USD) of each size in ``region``: the price history's
    newest entry, ``properties.spotPrices[0].priceUSD``, as the Spot docs' sample query reads it."""
    return (f"SpotResources | where type =~ '{SPOT_PRICE_HISTORY_TYPE}' | where location =~ "
            f"{_quoted(region.lower())} | where sku.name in~ ({_names(sizes)}) | where properties.osType =~ 'linux' "
            "| project skuName = tostring(sku.name), location, "
            "latestSpotPriceUSD = todouble(properties.spotPrices[0].priceUSD)")


def latest_spot_prices(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Lower-case size -> its latest Spot price in USD, from the rows of ``spot_price_history_query``."""
    found = {}
    for row in rows:
        price = row.get("latestSpotPriceUSD")
        if isinstance(price, (int, float)) and not isinstance(price, bool):
            found[str(row.get("skuName", "")).lower()] = float(price)
    return found


def eviction_rates(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Lower-case size -> band, from the rows of ``eviction_rate_query`` (bands the table does not know are
    dropped: they would sort wrong)."""
    return {str(r.get("skuName", "")).lower(): str(r.get("evictionRate")) for r in rows
            if str(r.get("evictionRate")) in EVICTION_BANDS}


def band_order(band: str | None) -> int:
    return EVICTION_BANDS.index(band) if band in EVICTION_BANDS else len(EVICTION_BANDS)


# ---------------------------------------------------------------- what a job cost

def job_cost(hours: dict[str, float], useful_node_hours: float | None, price: HourlyPrice) -> dict[str, Any]:
    """Node-hours by pool priority ("Spot", "Regular") priced at the size's current prices: what they cost, the
    same node-hours at on-demand prices, the saving (amount and %), and the cost per goodput-hour (cost / the
    node-hours of steps that ended in the final model). A price that is not known leaves its figures unknown."""
    spot_hours, regular_hours = hours.get("Spot", 0.0), hours.get("Regular", 0.0)
    total_hours = spot_hours + regular_hours
    cost = on_demand = None
    if price.on_demand is not None and (price.spot is not None or spot_hours == 0):
        cost = spot_hours * (price.spot or 0.0) + regular_hours * price.on_demand
    if price.on_demand is not None:
        on_demand = total_hours * price.on_demand
    saved = None if cost is None or on_demand is None else on_demand - cost
    shown = {**price.as_dict(), "nodeHours": {k: round(v, 4) for k, v in hours.items()},
             "cost": _money(cost), "onDemandCost": _money(on_demand), "saved": _money(saved),
             "savedPercent": UNKNOWN if saved is None or not on_demand else round(100 * saved / on_demand, 1),
             "costPerGoodputHour": UNKNOWN if cost is None or not useful_node_hours
             else _money(cost / useful_node_hours)}
    return shown


def _money(value: float | None) -> float | str:
    return UNKNOWN if value is None else round(value, 6)  # a short job's cost is a fraction of a cent


# ---------------------------------------------------------------- where to run (sku list)

def spot_offers(sizes: list[Any], price_of: dict[str, HourlyPrice], rates: dict[str, str], spot_vcpus_free: int | None,
                *, latest_usd: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One row per size (``core.aks.preflight.VmSize``): GPUs, Spot and on-demand price per hour, the Spot price per
    GPU-hour, the saving, the eviction-rate band, the Spot nodes the quota left allows and (``latest_usd``)
    Resource Graph's latest Spot price in USD; cheapest per GPU first, sizes of unknown price last."""
    rows = []
    for size in sizes:
        price = price_of.get(size.name.lower()) or HourlyPrice(size.name, "", DEFAULT_CURRENCY, None, None)
        per_gpu = None if price.spot is None or not size.gpus else price.spot / size.gpus
        saving = (None if price.spot is None or not price.on_demand
                  else round(100 * (price.on_demand - price.spot) / price.on_demand, 1))
        row = {"name": size.name, "gpus": size.gpus, "vCPUs": size.vcpus, "currency": price.currency,
               "spotPerHour": _or_unknown(price.spot), "onDemandPerHour": _or_unknown(price.on_demand),
               "spotPerGpuHour": _money(per_gpu), "spotSavingPercent": _or_unknown(saving),
               "evictionRate": rates.get(size.name.lower(), UNKNOWN),
               "spotNodesQuotaAllows": (UNKNOWN if spot_vcpus_free is None or not size.vcpus
                                        else max(spot_vcpus_free, 0) // size.vcpus)}
        if latest_usd is not None:  # Resource Graph's Spot price history: Azure's latest price, in USD
            row["latestSpotPriceUsd"] = latest_usd.get(size.name.lower(), UNKNOWN)
        if price.error:
            row["priceError"] = price.error
        rows.append((per_gpu is None, per_gpu or 0.0, size.name, row))
    return [row for *_, row in sorted(rows, key=lambda r: r[:3])]


def node_hours(shown: Mapping[str, Any], priority: str) -> tuple[dict[str, float], float | None]:
    """A described job's node-hours (``job show``'s ``rankSeconds`` / ``nprocPerNode`` ranks a node), all of
    ``priority`` (the pool its workers run on), and the useful ones; ({}, None) before it trained."""
    ranks = shown.get("rankSeconds") or {}
    per_node = int(shown.get("nprocPerNode") or 1) or 1
    if not ranks:
        return {}, None
    return ({priority: ranks["total"] / per_node / 3600}, ranks["useful"] / per_node / 3600)


def cost_line(cost: dict[str, Any] | None) -> str:
    """One line of what a job cost, for the timeline picture and the demo's summary."""
    if not cost:
        return "cost: not priced (a local job: --price-as SIZE -l REGION prices it as Azure Spot nodes)"
    where = f"{cost.get('vmSize')} Spot in {cost.get('location')}"
    if cost.get("cost") == UNKNOWN:
        why = f" ({cost['priceError']})" if cost.get("priceError") else " (no Spot price for it)"
        return f"cost: unknown as {where}{why}"
    currency = cost.get("currency")
    hours = sum((cost.get("nodeHours") or {}).values())
    return (f"cost: {cost['cost']:.4g} {currency} as {where} for {hours:.3f} node-hours; on-demand "
            f"{_text(cost.get('onDemandCost'))} {currency}, saved {_text(cost.get('savedPercent'))}%; "
            f"{_text(cost.get('costPerGoodputHour'))} {currency} per goodput node-hour")


def _text(value: float | str | None) -> str:
    if value is None:
        return UNKNOWN
    return value if isinstance(value, str) else f"{value:.4g}"
