"""A local Azure Retail Prices API (``GET /api/retail/prices``) on loopback, shaped by its documentation
(https://learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices), for the tests and the
docs' sample outputs. Azure itself is not reachable here.

What comes from where:

* **Answer**: ``{"BillingCurrency", "CustomerEntityId": "Default", "CustomerEntityType": "Retail", "Items",
  "NextPageLink", "Count"}`` as the doc's "API response" sample; an item has the sample item's fields
  (``currencyCode``, ``tierMinimumUnits``, ``retailPrice``, ``unitPrice``, ``armRegionName``, ``location``,
  ``effectiveStartDate``, ``meterId``, ``meterName``, ``productId``, ``skuId``, ``productName``, ``skuName``,
  ``serviceName``, ``serviceId``, ``serviceFamily``, ``unitOfMeasure``, ``type``, ``isPrimaryMeterRegion``,
  ``armSkuName``).
* **Meters of a VM size**: the doc's samples and the API's real answers list, per size and region, a Linux
  and a Windows product (``productName`` "Virtual Machines <series> Series" / "... Series Windows"), each with a
  pay-as-you-go meter ("NC4as T4 v3"), a Spot meter ("NC4as T4 v3 Spot") and the retired Low Priority meter
  ("NC4as T4 v3 Low Priority"), plus reservations (``type`` "Reservation", ``unitOfMeasure`` "1 Hour" too, the
  price of the whole term) and dev/test prices (``type`` "DevTestConsumption"). A filter on size and region gets
  them all: what a naive reader mixes up. Two more kinds of meter carry the VM's ``armSkuName`` and
  ``serviceName`` 'Virtual Machines' without being its price (mattrobinsonsre/terrapod#932, which priced every
  Azure size from this API): the classic **Cloud Services** meters (``productName`` "<series> Series Cloud
  Services", meter "NC4as T4 v3", no "Windows" in any name, at a Windows-like rate; also seen in the API's answers
  quoted by other projects, e.g. "Dasv5 Series Cloud Services"), and **$0 placeholder meters** of sizes not yet
  priced (here a Linux Spot meter at 0.0, effective after the real one, so a newest-first pick takes it).
* **Filters**: ``$filter`` is ``field eq 'value'`` clauses joined by ``and`` on the documented filter fields;
  values compare exactly, case included: Microsoft's page for the API says filter values are case-sensitive
  ("Filter values are case-sensitive": from api-version 2023-01-01-preview on; earlier versions ignored case),
  so ``armSkuName eq 'standard_nc4as_t4_v3'`` finds nothing, as it may on Azure. Anything else is a 400 with the API's error shape (``{"Error": {"Code", "Message"}}``), and a violation the test sees.
* **Paging**: the doc's "API response pagination": at most 100 items a page, ``NextPageLink`` the URL of the next
  page (``$skip``), null on the last. ``page_size`` makes pages smaller so that a test pages with few meters.
* **Currency**: ``currencyCode='EUR'`` (quoted, as the doc's examples) prices in that currency; the API's
  supported list is the doc's. The figures here are the test's own, not Azure's: each currency is the USD price
  times a fixed rate.
* **Faults**: ``fail_next(status)`` answers the next request with that status; ``garble_next(kind)`` breaks the
  next answer on the wire: "truncated" (a Content-Length longer than the body, then the connection closed:
  ``http.client.IncompleteRead``), "status-line" (a status line that is not HTTP: ``BadStatusLine``), "not-json", "not-items" (JSON whose ``Items`` is no list).
* **Sizes without a Spot meter**: ``drop_spot(size)`` removes a size's Spot meters (a test of "unknown").
"""
from __future__ import annotations

import json
import re
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

# The test's own hourly USD prices (Linux pay-as-you-go, Linux Spot): illustrative, NOT Azure's. None: no meter.
PRICES = {
    "Standard_NC4as_T4_v3": ("NCasT4_v3", "NC4as T4 v3", 0.526, 0.0789),
    "Standard_NC24ads_A100_v4": ("NCadsA100v4", "NC24ads A100 v4", 3.673, 0.7346),
    "Standard_NC40ads_H100_v5": ("NCadsH100v5", "NC40ads H100 v5", 6.98, 1.396),
    "Standard_ND96isr_H100_v5": ("NDsrH100v5", "ND96isr H100 v5", 98.32, 19.664),
    "Standard_ND96isr_H200_v5": ("NDsrH200v5", "ND96isr H200 v5", 110.24, 22.048),
    "Standard_D4s_v5": ("Dsv5", "D4s v5", 0.192, 0.0384),
    "Standard_D4ds_v5": ("Ddsv5", "D4ds v5", 0.226, 0.0452),
}
REGIONS = {"eastus": "US East", "westus": "US West"}
#: Region -> price factor (a region's prices differ): westus costs more here.
REGION_FACTOR = {"eastus": 1.0, "westus": 1.1}
#: The doc's supported currencies, each with the test's fixed rate to USD.
CURRENCIES = {"USD": 1.0, "AUD": 1.5, "BRL": 5.0, "CAD": 1.4, "CHF": 0.9, "CNY": 7.2, "DKK": 6.9, "EUR": 0.92,
              "GBP": 0.79, "INR": 83.0, "JPY": 150.0, "KRW": 1350.0, "NOK": 10.6, "NZD": 1.65, "RUB": 92.0,
              "SEK": 10.4, "TWD": 32.0}
FILTER_FIELDS = ("armRegionName", "location", "meterId", "meterName", "productid", "skuId", "productName",
                 "skuName", "serviceName", "serviceId", "serviceFamily", "priceType", "armSkuName")
PAGE = 100


def _meters(size: str, region: str) -> list[dict]:
    series, meter, linux, spot = PRICES[size]
    factor = REGION_FACTOR[region]
    rows = [_item(size, region, f"{series} Series Cloud Services", name, "Consumption", price * factor * 1.9)
            for name, price in ((meter, linux), (f"{meter} Low Priority", linux * .2))]  # not the VM's price
    # the order a reader must not rely on (the API promises none): the superseded Spot price first, then Windows,
    # and the Low Priority meter before the pay-as-you-go one
    if spot is not None:
        rows.append({**_item(size, region, f"Virtual Machines {series} Series", f"{meter} Spot", "Consumption",
                             spot * factor * 3), "effectiveStartDate": "2023-01-01T00:00:00Z"})
    for os_suffix, os_factor in ((" Windows", 1.8), ("", 1.0)):
        product = f"Virtual Machines {series} Series{os_suffix}"
        for name, price in ((f"{meter} Low Priority", linux and linux * .2), (f"{meter} Spot", spot), (meter, linux)):
            if price is None:
                continue
            rows.append(_item(size, region, product, name, "Consumption", price * factor * os_factor))
            if name.endswith("Spot") and not os_suffix:  # a placeholder: $0, effective after the real price
                rows.append({**_item(size, region, product, name, "Consumption", 0.0),
                             "effectiveStartDate": "2026-01-01T00:00:00Z", "meterId": f"{size}-{region}-0".lower()})
            if not name.endswith(("Spot", "Priority")):
                rows.append(_item(size, region, product, name, "DevTestConsumption", price * factor * .6))
        rows.append(_item(size, region, product, meter, "Reservation", linux * factor * os_factor * 5000,
                          term="1 Year"))
    return rows


def _item(size, region, product, name, kind, price, term=None) -> dict:
    item = {"currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": round(price, 6),
            "unitPrice": round(price, 6), "armRegionName": region, "location": REGIONS[region],
            "effectiveStartDate": "2025-06-01T00:00:00Z", "meterId": f"{size}-{region}-{name}-{kind}".lower(),
            "meterName": name, "productId": f"DZH318Z0{zlib.crc32(product.encode()) % 10**4:04d}",
            "skuId": f"DZH318Z0/{zlib.crc32(name.encode()) % 10**4:04d}", "availabilityId": None, "productName": product,
            "skuName": name, "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8",
            "serviceFamily": "Compute", "unitOfMeasure": "1 Hour", "type": kind, "isPrimaryMeterRegion": True,
            "armSkuName": size}
    if term:
        item["reservationTerm"] = term
    return item


def catalog() -> list[dict]:
    return [m for size in PRICES for region in REGIONS for m in _meters(size, region)]


class PricesServer:
    """See the module docstring. ``requests`` holds each URL asked; ``violations`` what was refused."""

    def __init__(self, page_size: int = PAGE) -> None:
        self.page_size = page_size
        self.items = catalog()
        self.requests: list[str] = []
        self.violations: list[str] = []
        self._fail: list[int] = []
        self._garble: list[str] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/api/retail/prices"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="prices-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> "PricesServer":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def fail_next(self, status: int) -> None:
        self._fail.append(status)

    def garble_next(self, kind: str) -> None:
        """Break the next answer on the wire: "truncated", "status-line" or "not-json" (the module docstring)."""
        assert kind in ("truncated", "status-line", "not-json", "not-items"), kind
        self._garble.append(kind)

    def garbled(self) -> str | None:
        with self._lock:
            return self._garble.pop(0) if self._garble else None

    def drop_spot(self, size: str) -> None:
        """The size has no Spot meter (as a size Azure does not sell as Spot in a region)."""
        self.items = [i for i in self.items if not (i["armSkuName"] == size and "Spot" in i["meterName"])]

    def answer(self, raw_path: str) -> tuple[int, dict]:
        with self._lock:
            self.requests.append(raw_path)
            if self._fail:
                status = self._fail.pop(0)
                return status, {"Error": {"Code": "InternalServerError" if status >= 500 else "BadRequest",
                                          "Message": "injected failure"}}
        parts = urlsplit(raw_path)
        if parts.path.rstrip("/") != "/api/retail/prices":
            return self._refuse(404, f"GET {parts.path}: not the Retail Prices API")
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        currency = query.get("currencyCode", "'USD'")
        quoted = re.fullmatch(r"'([A-Za-z]{3})'", currency)
        if not quoted or quoted[1].upper() not in CURRENCIES:
            return self._refuse(400, f"currencyCode {currency!r}: not a supported currency in quotes")
        try:
            wanted = _parse_filter(query.get("$filter", ""))
        except ValueError as ex:
            return self._refuse(400, str(ex))
        rate = CURRENCIES[quoted[1].upper()]
        found = [_priced(i, quoted[1].upper(), rate) for i in self.items if _matches(i, wanted)]
        skip = int(query.get("$skip", 0))
        page = found[skip:skip + self.page_size]
        following = None
        if skip + self.page_size < len(found):
            following = f"{self.url}?{urlencode({**query, '$skip': skip + self.page_size})}"
        return 200, {"BillingCurrency": quoted[1].upper(), "CustomerEntityId": "Default",
                     "CustomerEntityType": "Retail", "Items": page, "NextPageLink": following, "Count": len(page)}

    def _refuse(self, status: int, text: str) -> tuple[int, dict]:
        self.violations.append(text)
        return status, {"Error": {"Code": "BadRequest", "Message": text}}


def _parse_filter(text: str) -> list[tuple[str, str]]:
    clauses = []
    for clause in re.split(r"\s+and\s+", text.strip()) if text.strip() else []:
        match = re.fullmatch(r"(\w+)\s+eq\s+'((?:[^']|'')*)'", clause.strip())
        if not match or match[1].lower() not in {f.lower() for f in FILTER_FIELDS}:
            raise ValueError(f"$filter clause {clause!r}: not '<documented field> eq '<value>''")
        clauses.append((match[1], match[2].replace("''", "'")))
    return clauses


def _matches(item: dict, wanted: list[tuple[str, str]]) -> bool:
    fields = {k.lower(): v for k, v in item.items()}
    fields["pricetype"] = item["type"]
    fields["productid"] = item["productId"]
    return all(str(fields.get(name.lower(), "")) == value for name, value in wanted)  # case-sensitive


def _priced(item: dict, currency: str, rate: float) -> dict:
    price = round(item["retailPrice"] * rate, 6)
    return {**item, "currencyCode": currency, "retailPrice": price, "unitPrice": price}


def _handler(server: PricesServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            status, payload = server.answer(self.path)
            data = json.dumps(payload).encode()
            garbled = server.garbled()
            if garbled == "status-line":
                self.wfile.write(b"garbage that is no status line\r\n\r\n")
                self.close_connection = True
                return
            if garbled == "not-json":
                data = b"<html>upstream timed out</html>"
            if garbled == "not-items":
                data = json.dumps({**payload, "Items": {"Count": 1}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data) * (2 if garbled == "truncated" else 1)))
            self.end_headers()
            self.wfile.write(data[:len(data) // 2] if garbled == "truncated" else data)
            if garbled == "truncated":
                self.close_connection = True

        def log_message(self, *args) -> None:
            pass

    return Handler


if __name__ == "__main__":  # a front for a demo or a docs run: prints its URL, serves until killed
    import sys
    import time

    with PricesServer() as front:
        print(front.url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            sys.exit(0)
