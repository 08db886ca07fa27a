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
        self.bands_missing: list[str] = []  # the sizes of the last ``rates`` Resource Graph had no band for

    def rates(self, sizes: list[str], location: str) -> dict[str, str]:
        """Lower-case size -> eviction-rate band; {} (and ``rates_error``) where Resource Graph cannot say."""
        from azext_elastictrain.core.errors import ArmError

        self.bands_missing = []
        try:
            rows = self._arm.resource_graph(core_prices.eviction_rate_query(sizes, location))
        except (ArmError, OSError) as ex:  # OSError: a timeout or connection error of requests
            self.rates_error = f"Resource Graph could not be read: {ex}"
            return {}
        self.rates_error = None
        found = core_prices.eviction_rates(rows)
        self.bands_missing = [s for s in sizes if s.lower() not in found]
        return found

    def missing_bands_note(self, location: str) -> str | None:
        """Why the last ``rates`` left some sizes without a band, or None when every size has one."""
        if self.rates_error:
            return self.rates_error
        if not self.bands_missing:
            return None
        return (f"Resource Graph has no Spot eviction-rate band for {', '.join(self.bands_missing)} in {location} "
                "(SpotResources lists none for it); see the Azure portal's Spot pricing history and eviction rates")

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
        note = self.missing_bands_note(location)
        if note:
            shown["evictionRateError"] = note
        return shown


def for_arm(cli_ctx: Any, arm: Any, currency: str | None = None) -> SpotMarket:
    return SpotMarket(for_command(cli_ctx, currency), arm)
