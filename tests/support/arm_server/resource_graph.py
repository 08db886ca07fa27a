"""The ARM test server's Resource Graph queries (Spot eviction rates and prices)."""
from __future__ import annotations

import re
from typing import Any

from tests.support.arm_server.identity import SUBSCRIPTIONS
from tests.support.arm_server.routes import _error


class ResourceGraphFront:  # pylint: disable=too-few-public-methods
    """Resource Graph: Spot eviction rates and prices.
    A part of ArmServer: its state is the server's."""

    def _resource_graph(self, method: str, query: dict, body: Any) -> tuple[int, dict, Any]:
        """POST /providers/Microsoft.ResourceGraph/resources (Resources_Resources, api-version 2022-10-01): the
        body ``{"subscriptions", "query", "options"}``, the answer ``{"totalRecords", "count", "data",
        "facets", "resultTruncated"}`` with ``data`` an array of objects (``options.resultFormat``
        objectArray), as the REST reference's examples. Only the two ``SpotResources`` queries the extension
        sends are understood, each for one region and ``sku.name in~ (...)``, with the projections of the Spot docs'
        sample queries: type ``microsoft.compute/skuspotevictionrate/location`` -> ``{skuName, location,
        evictionRate}`` with Azure's bands ("0-5" ... "20+") from ``spot_eviction_rates``; type
        ``microsoft.compute/skuspotpricehistory/ostype/location`` (Linux) -> ``{skuName, location,
        latestSpotPriceUSD}`` from ``spot_prices_usd`` (each: lower-case region -> lower-case size -> value; a
        size without one has no row). Anything else is a 400, as a query Resource Graph cannot parse."""
        if method != "POST":
            return self._violation(f"{method} Resource Graph: queries are POSTed")
        if query.get("api-version") != "2022-10-01":
            return self._violation(f"Resource Graph: api-version {query.get('api-version')!r}, not 2022-10-01")
        body = body if isinstance(body, dict) else {}
        if not set(body.get("subscriptions") or []) <= set(SUBSCRIPTIONS) or not body.get("subscriptions"):
            return self._violation(f"Resource Graph: subscriptions {body.get('subscriptions')!r}")
        if (body.get("options") or {}).get("resultFormat") != "objectArray":
            return self._violation("Resource Graph: options.resultFormat is not objectArray")
        text = str(body.get("query") or "")
        head = (r"SpotResources \| where type =~ '(microsoft\.compute/[a-z/]+)' \| where location =~ '([a-z0-9]+)' "
                r"\| where sku\.name in~ \(([^)]*)\) ")
        rates = re.fullmatch(head + r"\| project skuName = tostring\(sku\.name\), location, evictionRate = "
                                    r"tostring\(properties\.evictionRate\)", text)
        prices = re.fullmatch(head + r"\| where properties\.osType =~ 'linux' \| project skuName = "
                                     r"tostring\(sku\.name\), location, latestSpotPriceUSD = "
                                     r"todouble\(properties\.spotPrices\[0\]\.priceUSD\)", text)
        if rates and rates[1] == "microsoft.compute/skuspotevictionrate/location":
            asked, column, table = rates, "evictionRate", self.spot_eviction_rates
        elif prices and prices[1] == "microsoft.compute/skuspotpricehistory/ostype/location":
            asked, column, table = prices, "latestSpotPriceUSD", self.spot_prices_usd
        else:
            return 400, {}, _error("BadRequest", f"Query is invalid: {text[:200]}")
        known = table.get(asked[2], {})
        rows = [{"skuName": size, "location": asked[2], column: known[size]}
                for size in re.findall(r"'([^']+)'", asked[3]) if size in known]
        return 200, {}, {"totalRecords": len(rows), "count": len(rows), "data": rows, "facets": [],
                         "resultTruncated": "false"}
