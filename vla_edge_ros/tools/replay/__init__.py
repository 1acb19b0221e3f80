"""Offline evaluation: replay a bag through the live pipeline's own objects on a virtual or real clock."""

from ...runtime.block_costs import CostModel, parse_cost
from .runner import replay_bag

__all__ = ["CostModel", "parse_cost", "replay_bag"]
