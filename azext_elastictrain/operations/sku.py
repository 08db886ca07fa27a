"""az elastictrain sku: where to run. The Spot-capable GPU sizes a region offers the subscription (Resource SKUs,
as the cluster preflight reads them), with their Spot and on-demand prices (Retail Prices API), eviction-rate
band (Resource Graph) and the Spot quota left (Usage).

A price or band that cannot be had is "unknown" and the list is still shown; a region that offers nothing, or a
currency the price API does not know, is an az error.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from azext_elastictrain._errors import az_errors

if TYPE_CHECKING:
    from azext_elastictrain.core.ports import Arm
    from azext_elastictrain.core.aks.preflight import VmSize


def list_skus(cmd: Any, location: str, gpu: str | None = None, currency: str | None = None) -> list[dict[str, Any]]:
    from azure.cli.core.azclierror import InvalidArgumentValueError
    from knack.log import get_logger

    from azext_elastictrain._validators import AKS, Target
    from azext_elastictrain.clients import prices as price_client
    from azext_elastictrain.clients.arm import AzureArm
    from azext_elastictrain.clients.spot import SpotMarket
    from azext_elastictrain.core.aks import preflight
    from azext_elastictrain.core import prices as core_prices

    try:
        retail = price_client.for_command(cmd.cli_ctx, currency)  # bad input fails before any request
    except core_prices.CurrencyError as ex:
        raise InvalidArgumentValueError(f"--currency: {ex}", recommendation=ex.recommendation) from ex
    location = location.strip().lower()
    with az_errors(Target(AKS)):
        arm = AzureArm(cmd.cli_ctx)
        offered = _spot_gpu_sizes(arm, location, gpu)
        names = [s.name for s in offered]
        market = SpotMarket(retail, arm)
        rates = market.rates(names, location)
        latest = market.latest_spot_usd(names, location) if not market.rates_error else {}
        rows = core_prices.spot_offers(offered, retail.prices(names, location), rates,
                                       preflight.spot_quota(arm.usages(location)), latest_usd=latest)
    if market.missing_bands_note(location):
        get_logger(__name__).warning("Eviction rates are unknown: %s", market.missing_bands_note(location))
    price_error = next((r["priceError"] for r in rows if r.get("priceError")), None)
    if price_error:
        get_logger(__name__).warning("Prices are unknown: %s", price_error)
    return rows


def _spot_gpu_sizes(arm: Arm, location: str, gpu: str | None) -> list[VmSize]:
    """The region's Spot-capable GPU sizes open to the subscription (``core.aks.preflight.VmSize``), ``gpu`` in their
    name where given; ResourceNotFoundError where there is none, or the region lists no size at all."""
    from azure.cli.core.azclierror import ResourceNotFoundError

    from azext_elastictrain.core.aks import preflight

    sizes = preflight.vm_sizes(arm.resource_skus(location), location)
    if not sizes:
        raise ResourceNotFoundError(
            f"Resource SKUs lists no VM size in region {location!r}: it is not a region name, or not one "
            "this subscription can use",
            recommendation="List the regions with 'az account list-locations --query \"[].name\" -o tsv'.")
    offered = [sizes[name.lower()] for name in preflight.spot_gpu_sizes(sizes)]
    if gpu:
        offered = [s for s in offered if gpu.lower() in s.name.lower()]
    if not offered:
        which = f" whose name has {gpu!r}" if gpu else ""
        raise ResourceNotFoundError(
            f"region {location!r} offers this subscription no Spot-capable GPU size{which}",
            recommendation="Try another region with -l" + (", or leave out --gpu." if gpu else "."))
    return offered
