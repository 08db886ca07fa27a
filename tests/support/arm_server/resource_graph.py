"""The ARM test server's Resource Graph queries (Spot eviction rates and prices)."""
from __future__ import annotations

import re
from typing import Any

from tests.support.arm_server.identity import SUBSCRIPTIONS
from tests.support.arm_server.routes import _error

#: An answer header the test server's handler reads (and drops): hold the answer that many seconds.
STALL_HEADER = "x-test-stall-seconds"


class ResourceGraphFront:  # pylint: disable=too-few-public-methods
    """Resource Graph: Spot eviction rates and prices.
    A part of ArmServer: its state is the server's."""

    def stall_graph(self, seconds: float) -> None:
        """Hold the next Resource Graph answer ``seconds`` (a service that does not answer in time)."""
        self.expect["graph_stall_seconds"] = seconds

    def _resource_graph(self, method: str, query: dict, body: Any) -> tuple[int, dict, Any]:
        """POST /providers/Microsoft.ResourceGraph/resources (Resources_Resources, api-version 2022-10-01): the
        body ``{"subscriptions"?, "managementGroups"?, "query", "options"}``, the answer ``{"totalRecords", "count",
        "data", "facets", "resultTruncated"}`` with ``data`` an array of objects (``options.resultFormat``
        objectArray), as the REST reference's examples. Only the two ``SpotResources`` queries the extension
        sends are understood, each for one region and ``sku.name in~ (...)``, with the projections of the Spot docs'
        sample queries: type ``microsoft.compute/skuspotevictionrate/location`` -> ``{skuName, location,
        evictionRate}`` with Azure's bands ("0-5" ... "20+") from ``spot_eviction_rates``; type
        ``microsoft.compute/skuspotpricehistory/ostype/location`` (Linux) -> ``{skuName, location,
        latestSpotPriceUSD}`` from ``spot_prices_usd`` (each: lower-case region -> lower-case size -> value; a
        size without one has no row). Anything else is a 400, as a query Resource Graph cannot parse.

        **Scope, as Azure answers it.** ``SpotResources`` rows belong to no subscription: a query scoped to
        subscriptions (a non-empty ``subscriptions``) is answered 200 with no row at all, and only a tenant-scoped
        one (no ``subscriptions``, or ``[]``: the REST reference's "Basic tenant query" example) gets the rows.
        Sources: grafana/grafana#103702 (the same SpotResources query "NOT WORKING" with a subscription,
        "WORKING" with ``[]`` or none), grafana/grafana#105835 (Directory scope = ``subscriptions: []``),
        grafana/grafana#77378 ("queries using the SpotResources table" do not work at subscription scope).
        ``options.allowPartialScopes`` (tenant and management-group queries only) must be a boolean where sent.

        ``stall_graph(seconds)`` holds the next answer that long (a Resource Graph that does not answer)."""
        if method != "POST":
            return self._violation(f"{method} Resource Graph: queries are POSTed")
        if query.get("api-version") != "2022-10-01":
            return self._violation(f"Resource Graph: api-version {query.get('api-version')!r}, not 2022-10-01")
        body = body if isinstance(body, dict) else {}
        subscriptions = body.get("subscriptions") or []
        if not isinstance(subscriptions, list) or not set(subscriptions) <= set(SUBSCRIPTIONS):
            return self._violation(f"Resource Graph: subscriptions {body.get('subscriptions')!r}")
        options = body.get("options") or {}
        if options.get("resultFormat") != "objectArray":
            return self._violation("Resource Graph: options.resultFormat is not objectArray")
        if "allowPartialScopes" in options and not isinstance(options["allowPartialScopes"], bool):
            return self._violation(f"Resource Graph: allowPartialScopes {options['allowPartialScopes']!r}")
        held = {}  # the handler holds the answer (outside the server's lock) where a test stalls it
        if "graph_stall_seconds" in self.expect:
            held[STALL_HEADER] = str(self.expect.pop("graph_stall_seconds"))
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
            return 400, held, _error("BadRequest", f"Query is invalid: {text[:200]}")
        known = {} if subscriptions else table.get(asked[2], {})  # SpotResources: tenant scope only
        rows = [{"skuName": size, "location": asked[2], column: known[size]}
                for size in re.findall(r"'([^']+)'", asked[3]) if size in known]
        return 200, held, {"totalRecords": len(rows), "count": len(rows), "data": rows, "facets": [],
                           "resultTruncated": "false"}
