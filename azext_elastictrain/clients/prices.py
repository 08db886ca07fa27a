"""Azure's Retail Prices API, the one place the CLI talks to it: a public GET, no login (``core.prices`` reads
the answers). Each size's prices in a region are kept a day in a cache file under az's config folder.

A price that cannot be had (the API unreachable or slower than ``TIMEOUT``, an error status, an answer cut short
or garbled on the wire, an answer not in the documented shape) is unknown: ``HourlyPrice.error`` says why. The
failure is remembered ``FAILURE_SECONDS``: a ``job show`` or ``job wait`` run again and again does not wait
``TIMEOUT`` on an unreachable API each time; after that the next command asks again. Nothing here raises but
``CurrencyError`` (bad input, checked before any request).
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPException
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlencode

from azext_elastictrain.core import prices as core_prices

#: Seconds one request may take: a price is never worth blocking a command for long.
TIMEOUT = 10
#: Seconds a failed look-up is remembered: long enough that commands run in a loop do not each wait ``TIMEOUT``,
#: short enough that a passing outage costs a user a couple of minutes of "unknown", not a day.
FAILURE_SECONDS = 120
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
    if not isinstance(answer, dict) or not isinstance(answer.get("Items"), list) \
            or not all(isinstance(i, dict) for i in answer["Items"]):
        raise ValueError("the answer is not the documented {Items: [...]} object")
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
            entry = entry if isinstance(entry, dict) else None
            age = self._clock() - _fetched(entry)
            if entry and entry.get("error") and age < FAILURE_SECONDS and entry.get("endpoint") == endpoint():
                found[size.lower()] = core_prices.HourlyPrice(
                    core_prices.arm_size_name(size), region.lower(), self.currency, None, None,
                    error=f"{entry['error']} ({age:.0f} s ago; asked again after {FAILURE_SECONDS} s)")
            elif entry and "spot" in entry and age < core_prices.CACHE_SECONDS:
                found[size.lower()] = core_prices.HourlyPrice(core_prices.arm_size_name(size), region.lower(),
                                                              self.currency, entry.get("spot"), entry.get("onDemand"))
            else:
                missing.append(size)
        if missing:
            with ThreadPoolExecutor(max_workers=min(8, len(missing))) as pool:
                asked = list(pool.map(lambda s: self._ask(s, region), missing))
            for price in asked:
                found[price.size.lower()] = price
            self._write_cache(cached, asked)
        return found

    def _ask(self, size: str, region: str) -> core_prices.HourlyPrice:
        size = core_prices.arm_size_name(size)  # filter values are case-sensitive: as Resource SKUs spells it
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
        except (OSError, HTTPException, ValueError, KeyError, TypeError) as ex:
            # unreachable or too slow, an error status (HTTPError), cut short (IncompleteRead) or not HTTP
            # (BadStatusLine) on the wire, not JSON or not the documented shape
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
        fresh = {k: v for k, v in cached.items() if isinstance(v, dict)
                 and now - _fetched(v) < (FAILURE_SECONDS if v.get("error") else core_prices.CACHE_SECONDS)}
        for price in asked:
            fresh[self._key(price.size, price.region)] = {"fetched": now, "error": price.error,
                                                          "endpoint": endpoint()} if price.error \
                else {"fetched": now, "spot": price.spot, "onDemand": price.on_demand}
        try:
            self._cache.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._cache.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(fresh, sort_keys=True))
            temporary.replace(self._cache)  # atomic: two commands at once never leave half a file
        except OSError:
            pass  # a cache that cannot be written costs a request next time, nothing more


def _fetched(entry: Any) -> float:
    try:
        return float(entry.get("fetched", 0)) if isinstance(entry, dict) else 0.0
    except (TypeError, ValueError):
        return 0.0


def _reason(ex: Exception) -> str:
    code = getattr(ex, "code", None)
    if isinstance(code, int):  # urllib's HTTPError
        return f"HTTP {code}"
    if isinstance(ex, HTTPException):  # IncompleteRead, BadStatusLine: the text is bytes or the raw line
        return f"the answer was cut short or garbled ({type(ex).__name__})"
    if isinstance(ex, json.JSONDecodeError):
        return "the answer is not JSON"
    return str(getattr(ex, "reason", None) or ex) or type(ex).__name__


def for_command(cli_ctx: Any, currency: str | None) -> RetailPrices:
    """The prices of a command: cached in az's config folder (``AZURE_CONFIG_DIR``, ~/.azure by default)."""
    return RetailPrices(getattr(cli_ctx.config, "config_dir", None), currency)
