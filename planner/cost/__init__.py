"""The cost model: compute, communication and memory of a stage under a layout (no torch)."""

from planner.cost.collectives import allreduce_line, allreduce_ms, grad_group_line, link_of, p2p_ms, stage_links
from planner.cost.model import CostModel
from planner.cost.stage import StageTerms, price_stage, price_stages

__all__ = [
    "CostModel", "StageTerms", "allreduce_line", "allreduce_ms", "grad_group_line", "link_of", "p2p_ms", "price_stage",
    "price_stages", "stage_links",
]
