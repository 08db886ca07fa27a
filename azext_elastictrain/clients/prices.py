"""Azure's Retail Prices API, the one place the CLI talks to it: a public GET, no login (``core.prices`` reads
the answers). Each size's prices in a region are kept a day in a cache file under az's config folder.

A price that cannot be had (the API unreachable, an error status, an answer not in the documented shape) is
unknown: ``HourlyPrice.error`` says why, and nothing is cached, so the next command asks again. Nothing here
raises but ``CurrencyError`` (bad input, checked before any request).
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlencode

from azext_elastictrain.core import prices as core_prices

#: Seconds one request may take: a price is never worth blocking a command for long.
TIMEOUT = 10
CACHE_FILE = "elastictrain-prices.json"

Fetch = Callable[[str], dict[str, Any]]


def endpoint() -> str:
    return os.environ.get(core_prices.PRICES_URL_ENV) or core_prices.RETAIL_PRICES_URL


def fetch_json(url: str) -> dict[str, Any]:
    """GET ``url``; the JSON answer, or ``OSError``/``ValueError`` (an error status is an ``HTTPError``)."""
    from urllib.request import Request, urlopen

    request = Request(url, headers={"Accept": "application/json", "User-Agent": "az-elastictrain"})
    with urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310  (https, or the test front on loopback)
        answer = json.loads(response.read().decode("utf-8"))
    if not isinstance(answer, dict):
        raise ValueError(f"{url} answered {type(answer).__name__}, not a JSON object")
    return answer


class RetailPrices:
    """Hourly prices of VM sizes, from the cache when a day old at most, else from the API (pages followed)."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None, currency: str | None = None, *,
                 fetch: Fetch = fetch_json, clock: Callable[[], float] = time.time) -> None:
        self.currency = core_prices.currency_code(currency)
        self._cache = Path(cache_dir) / CACHE_FILE if cache_dir else None
        self._fetch, self._clock = fetch, clock

    def price(self, size: str, region: str) -> core_prices.HourlyPrice:
        return self.prices([size], region)[size.lower()]

    def prices(self, sizes: list[str], region: str) -> dict[str, core_prices.HourlyPrice]:
        """Lower-case size -> its price; the sizes not cached are asked for in parallel (a few at a time)."""
        cached = self._read_cache()
        found, missing = {}, []
        for size in sizes:
            entry = cached.get(self._key(size, region))
            if entry and self._clock() - float(entry.get("fetched", 0)) < core_prices.CACHE_SECONDS:
                found[size.lower()] = core_prices.HourlyPrice(size, region.lower(), self.currency,
                                                              entry.get("spot"), entry.get("onDemand"))
            else:
                missing.append(size)
        if missing:
            with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
                asked = list(pool.map(lambda s: self._ask(s, region), missing))
            for price in asked:
                found[price.size.lower()] = price
            self._write_cache(cached, [p for p in asked if p.error is None])
        return found

    def _ask(self, size: str, region: str) -> core_prices.HourlyPrice:
        query = urlencode({"currencyCode": f"'{self.currency}'",
                           "$filter": core_prices.retail_filter(size, region)})
        url: str | None = f"{endpoint()}?{query}"
        items: list[dict[str, Any]] = []
        try:
            for _ in range(core_prices.MAX_PAGES):
                if not url:
                    break
                page = self._fetch(url)
                items += list(page["Items"])
                url = page.get("NextPageLink")
        except (OSError, ValueError, KeyError, TypeError) as ex:  # unreachable, an error status, not JSON
            return core_prices.HourlyPrice(size, region.lower(), self.currency, None, None,
                                           error=f"the Retail Prices API could not be read: {_reason(ex)}")
        return core_prices.hourly_prices(items, size, region, self.currency)

    def _key(self, size: str, region: str) -> str:
        return f"{self.currency}/{region.lower()}/{size.lower()}"

    def _read_cache(self) -> dict[str, Any]:
        if self._cache is None:
            return {}
        try:
            found = json.loads(self._cache.read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def _write_cache(self, cached: dict[str, Any], asked: list[core_prices.HourlyPrice]) -> None:
        if self._cache is None or not asked:
            return
        now = self._clock()
        fresh = {k: v for k, v in cached.items() if now - float(v.get("fetched", 0)) < core_prices.CACHE_SECONDS}
        for price in asked:
            fresh[self._key(price.size, price.region)] = {"fetched": now, "spot": price.spot,
                                                          "onDemand": price.on_demand}
        try:
            self._cache.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._cache.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(fresh, sort_keys=True))
            temporary.replace(self._cache)  # atomic: two commands at once never leave half a file
        except OSError:
            pass  # a cache that cannot be written costs a request next time, nothing more


def _reason(ex: Exception) -> str:
    code = getattr(ex, "code", None)
    if isinstance(code, int):  # urllib's HTTPError
        return f"HTTP {code}"
    return str(getattr(ex, "reason", None) or ex) or type(ex).__name__


def for_command(cli_ctx: Any, currency: str | None) -> RetailPrices:
    """The prices of a command: cached in az's config folder (``AZURE_CONFIG_DIR``, ~/.azure by default)."""
    return RetailPrices(getattr(cli_ctx.config, "config_dir", None), currency)
