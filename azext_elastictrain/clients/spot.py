"""The Spot market of a region as one command sees it: prices (``clients.prices``, the public Retail Prices API)
and eviction-rate bands (Resource Graph through ``clients.arm.AzureArm``, with the login). Either may be
unknown: that is said, never guessed, and never fails the command.
"""
from __future__ import annotations

from typing import Any

from azext_elastictrain.clients.prices import RetailPrices, for_command
from azext_elastictrain.core import prices as core_prices


class SpotMarket:
    """``offer`` for one size (cluster create's preflight), ``rates`` and ``latest_spot_usd`` for several (sku
    list)."""

    def __init__(self, retail: RetailPrices, arm: Any) -> None:
        self.retail, self._arm = retail, arm
        self.rates_error: str | None = None  # why the last ``rates`` are unknown

    def rates(self, sizes: list[str], location: str) -> dict[str, str]:
        """Lower-case size -> eviction-rate band; {} (and ``rates_error``) where Resource Graph cannot say."""
        from azext_elastictrain.core.errors import ArmError

        try:
            rows = self._arm.resource_graph(core_prices.eviction_rate_query(sizes, location))
        except (ArmError, OSError) as ex:  # OSError: a connection error of requests
            self.rates_error = f"Resource Graph could not be read: {ex}"
            return {}
        self.rates_error = None
        return core_prices.eviction_rates(rows)

    def latest_spot_usd(self, sizes: list[str], location: str) -> dict[str, float]:
        """Lower-case size -> Resource Graph's latest Spot price in USD ({} and ``rates_error`` where it cannot)."""
        from azext_elastictrain.core.errors import ArmError

        try:
            rows = self._arm.resource_graph(core_prices.spot_price_history_query(sizes, location))
        except (ArmError, OSError) as ex:
            self.rates_error = f"Resource Graph could not be read: {ex}"
            return {}
        return core_prices.latest_spot_prices(rows)

    def offer(self, size: str, location: str) -> dict[str, Any]:
        """The size's Spot and on-demand price per hour and eviction-rate band in ``location``."""
        shown = self.retail.price(size, location).as_dict()
        shown["evictionRate"] = self.rates([size], location).get(size.lower(), core_prices.UNKNOWN)
        if self.rates_error:
            shown["evictionRateError"] = self.rates_error
        return shown


def for_arm(cli_ctx: Any, arm: Any, currency: str | None = None) -> SpotMarket:
    return SpotMarket(for_command(cli_ctx, currency), arm)
