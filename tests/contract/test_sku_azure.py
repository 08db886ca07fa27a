"""'az elastictrain sku list' through the real az: Resource SKUs and Usage from the ARM test server, eviction
rates from its Resource Graph handler (with the login's token), prices from the Retail Prices front
(tests/support/prices_server.py, pointed at by ELASTICTRAIN_PRICES_URL).

Both fronts answer as Azure does where it surprises: Resource Graph's SpotResources rows only at tenant scope (a
subscription-scoped query is answered with no row and no error: grafana/grafana#103702, #105835; see
tests/support/arm_server/resource_graph.py), and the Retail Prices API compares filter values case-sensitively
and serves Cloud Services and $0 placeholder meters under the VM's name (tests/support/prices_server.py)."""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from azext_elastictrain.clients.prices import CACHE_FILE
from azext_elastictrain.core.prices import PRICES_URL_ENV
from tests.support.prices_server import PricesServer

GRAPH = "/providers/microsoft.resourcegraph/resources"


@pytest.fixture(autouse=True)
def no_cached_prices(azure_login):
    """Each test starts without prices cached in the session's az config folder."""
    (Path(azure_login.config_dir) / CACHE_FILE).unlink(missing_ok=True)


@pytest.fixture
def front():
    with PricesServer(page_size=5) as server:
        yield server
        assert server.violations == []


def _graph_asked(arm) -> bool:
    return any(m == "POST" and p.split("?")[0].lower() == GRAPH for m, p in arm.requests)


def test_sku_list_shows_prices_bands_and_quota_cheapest_per_gpu_first(az, arm, front, tmp_path):
    arm.spot_quota("eastus").update(limit=100, currentValue=20)
    result = az("elastictrain", "sku", "list", "-l", "eastus", "-o", "json", env={PRICES_URL_ENV: front.url})
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == ["Standard_NC4as_T4_v3", "Standard_NC24ads_A100_v4",
                                         "Standard_NC40ads_H100_v5", "Standard_ND96isr_H100_v5",
                                         "Standard_ND96isr_H200_v5"], "by Spot price per GPU"
    t4 = rows[0]
    assert (t4["spotPerHour"], t4["onDemandPerHour"], t4["evictionRate"], t4["spotNodesQuotaAllows"],
            t4["currency"], t4["spotSavingPercent"]) == (0.0789, 0.526, "0-5", 20, "USD", 85.0)
    assert rows[3]["spotPerGpuHour"] == round(19.664 / 8, 4) and rows[3]["evictionRate"] == "20+"
    # every Spot-capable size has its band, its Spot price and Resource Graph's latest Spot price (USD)
    assert [r["evictionRate"] for r in rows] == ["0-5", "5-10", "10-15", "20+", "15-20"]
    assert [r["spotPerHour"] for r in rows] == [0.0789, 0.7346, 1.396, 19.664, 22.048]
    assert [r["latestSpotPriceUsd"] for r in rows] == [0.0771, 0.7213, 1.3702, 19.2031, 21.9904]
    assert "unknown" not in result.stderr, result.stderr
    assert _graph_asked(arm) and arm.violations == []
    asked = len(front.requests)
    again = az.json("elastictrain", "sku", "list", "-l", "eastus", env={PRICES_URL_ENV: front.url})
    assert again == rows and len(front.requests) == asked, "the second listing is priced from the day's cache"
    table = az("elastictrain", "sku", "list", "-l", "eastus", "--gpu", "a100", "-o", "table",
               env={PRICES_URL_ENV: front.url})
    assert "Standard_NC24ads_A100_v4" in table.stdout and "Standard_NC4as_T4_v3" not in table.stdout, table.stdout
    assert "5-10%" in table.stdout and "0.7346" in table.stdout


def test_spot_bands_are_asked_at_tenant_scope_where_resource_graph_has_them(az, arm, front):
    """Scoped to the subscription, Resource Graph answers a SpotResources query with no row (and no error): every
    band and latest price would read "unknown" with no warning. Asked at tenant scope, they are there."""
    rows = az.json("elastictrain", "sku", "list", "-l", "eastus", "--gpu", "A100", env={PRICES_URL_ENV: front.url})
    assert [(r["evictionRate"], r["latestSpotPriceUsd"]) for r in rows] == [("5-10", 0.7213)]
    assert sum(1 for m, p in arm.requests if m == "POST" and p.split("?")[0].lower() == GRAPH) == 2


def test_a_size_resource_graph_has_no_band_for_is_unknown_and_said(az, arm, front):
    del arm.spot_eviction_rates["eastus"]["standard_nd96isr_h200_v5"]
    result = az("elastictrain", "sku", "list", "-l", "eastus", "--gpu", "H", "-o", "json",
                env={PRICES_URL_ENV: front.url})
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["Standard_ND96isr_H200_v5"]["evictionRate"] == "unknown"
    assert rows["Standard_ND96isr_H100_v5"]["evictionRate"] == "20+"
    assert ("Eviction rates are unknown: Resource Graph has no Spot eviction-rate band for Standard_ND96isr_H200_v5 "
            "in eastus") in result.stderr, result.stderr


def test_a_resource_graph_that_does_not_answer_costs_the_timeout_not_the_command(az, arm, front):
    from azext_elastictrain.clients.arm import RESOURCE_GRAPH_TIMEOUT

    # Held far longer than the timeout, so the bound below tells "gave up at the timeout" from "waited for the
    # answer" with room for az's own start on a loaded machine (15 s in all once, under CI's seven workers).
    arm.stall_graph(RESOURCE_GRAPH_TIMEOUT + 60)
    started = time.monotonic()
    result = az("elastictrain", "sku", "list", "-l", "eastus", "--gpu", "T4", "-o", "json",
                env={PRICES_URL_ENV: front.url})
    took = time.monotonic() - started
    assert result.returncode == 0 and RESOURCE_GRAPH_TIMEOUT <= took < RESOURCE_GRAPH_TIMEOUT + 30, took
    assert "Eviction rates are unknown: Resource Graph could not be read" in result.stderr, result.stderr
    assert "timed out" in result.stderr and "Traceback" not in result.stderr
    (row,) = json.loads(result.stdout)
    assert (row["evictionRate"], row["spotPerHour"]) == ("unknown", 0.0789), "the prices are still shown"


def test_sku_list_in_another_currency(az, arm, front):
    rows = az.json("elastictrain", "sku", "list", "-l", "westus", "--gpu", "T4", "--currency", "eur",
                   env={PRICES_URL_ENV: front.url})
    assert [(r["name"], r["currency"], r["onDemandPerHour"]) for r in rows] == [
        ("Standard_NC4as_T4_v3", "EUR", round(0.526 * 1.1 * 0.92, 6))]


def test_a_currency_the_api_does_not_know_is_an_az_error_before_any_request(az, arm, front):
    result = az("elastictrain", "sku", "list", "-l", "eastus", "--currency", "XYZ", check=False,
                env={PRICES_URL_ENV: front.url})
    assert result.returncode == 1 and "currency 'XYZ' is not one" in result.stderr, result.stderr
    assert "EUR" in result.stderr and "Traceback" not in result.stderr
    assert front.requests == [] and arm.requests == []


def test_an_unknown_region_is_an_az_error(az, arm, front):
    result = az("elastictrain", "sku", "list", "-l", "atlantis", check=False, env={PRICES_URL_ENV: front.url})
    assert result.returncode != 0 and "lists no VM size in region 'atlantis'" in result.stderr, result.stderr
    assert "az account list-locations" in result.stderr and "Traceback" not in result.stderr
    retired = az("elastictrain", "sku", "list", "-l", "eastus", "--gpu", "V100", check=False,
                 env={PRICES_URL_ENV: front.url})
    assert retired.returncode != 0 and "no Spot-capable GPU size whose name has 'V100'" in retired.stderr
    assert "leave out --gpu" in retired.stderr and front.requests == []


def test_unreachable_prices_and_graph_errors_leave_unknowns_and_the_list_still_shows(az, arm):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}/api/retail/prices"
    arm.fail_once("POST", GRAPH, status=403, code="AuthorizationFailed", message="no read on SpotResources")
    result = az("elastictrain", "sku", "list", "-l", "eastus", "--gpu", "T4", "-o", "json", check=False,
                env={PRICES_URL_ENV: nowhere})
    assert result.returncode == 0, result.stderr
    assert "Eviction rates are unknown" in result.stderr and "AuthorizationFailed" in result.stderr
    assert "Prices are unknown: the Retail Prices API could not be read" in result.stderr
    (row,) = json.loads(result.stdout)
    assert (row["spotPerHour"], row["onDemandPerHour"], row["evictionRate"]) == ("unknown", "unknown", "unknown")
    assert "could not be read" in row["priceError"]


@pytest.mark.parametrize("kind, why", [("truncated", "IncompleteRead"), ("status-line", "BadStatusLine")])
def test_a_price_answer_cut_short_on_the_wire_is_unknown_not_a_traceback(az, arm, front, kind, why):
    front.garble_next(kind)
    result = az("elastictrain", "sku", "list", "-l", "eastus", "--gpu", "T4", "-o", "json",
                env={PRICES_URL_ENV: front.url})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    (row,) = json.loads(result.stdout)
    assert (row["spotPerHour"], row["onDemandPerHour"], row["evictionRate"]) == ("unknown", "unknown", "0-5")
    assert f"Prices are unknown: the Retail Prices API could not be read: the answer was cut short or garbled ({why})" \
        in result.stderr
    again = az.json("elastictrain", "sku", "list", "-l", "eastus", "--gpu", "T4", env={PRICES_URL_ENV: front.url})
    assert again[0]["spotPerHour"] == "unknown" and "s ago; asked again after 120 s" in again[0]["priceError"], \
        "the failure is remembered a short while: the next command does not wait on the API again"
