"""The search's tuning constants, in one frozen value (each with the reason for its value)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.artifacts.kinds import SolverKind


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSettings:
    """How hard the default search looks. ``SETTINGS`` is what ``planner plan`` uses."""

    prune_degrees: bool = field(
        default=True,
        metadata={"doc": "visit every tensor- x context-parallel degree's configurations in one order by lower bound, "
                         "against one incumbent (planner.solve.search.pruned_degrees); off: each degree searched on "
                         "its own, every cp = 1 degree in full (the search before issue 24)"},
    )
    prune_configs: bool = field(
        default=True,
        metadata={"doc": "skip configurations (and whole degrees) whose lower bound cannot beat the best time so far "
                         "(time objective); off, with prune_degrees off: the exhaustive search the tests compare with"},
    )
    interleave_factors: tuple[int, ...] = field(
        default=(2, 3, 4),
        metadata={"doc": "virtual stages per rank tried for interleaved 1F1B (Narayanan et al. 2021 use 2-4, Korthikanti "
                         "et al. 2022 3 for 175B and 530B)"},
    )
    rebalance_rounds: int = field(
        default=3,
        metadata={"doc": "re-solves of an interleaved configuration with each chunk's memory set from the last "
                         "solution's need plus its rank's slack (planner.solve.proposals.rebalanced); each stops "
                         "early once the solution repeats"},
    )
    memory_cap_fractions: tuple[float, ...] = field(
        default=(0.75, 0.5), metadata={"doc": "tighter memory caps (fractions of the cap) searched for the Pareto front"}
    )
    rescore_top: int = field(
        default=4, metadata={"doc": "candidates replayed in full (Plan + Timeline) after the fast simulation"}
    )
    pareto_configs: int = field(
        default=3, metadata={"doc": "configurations re-solved under tighter memory caps for the Pareto front (time objective)"}
    )
    alternative_partitions: tuple[SolverKind, ...] = field(
        default=(SolverKind.TIME_BALANCED, SolverKind.PIPEDREAM),
        metadata={"doc": "baseline partitions also proposed for every configuration the DP solves"},
    )
    chain_max: int = field(
        default=64, metadata={"doc": "longest chain searched exactly over every configuration; longer profiles are grouped"}
    )
    explain_max_layers: int = field(
        default=256, metadata={"doc": "longest profile the infeasibility explanation searches layer by layer (else over groups)"}
    )
    refine_slack: float = field(
        default=0.05,
        metadata={"doc": "on a grouped profile, a solved configuration's proposals are simulated (and its best kept "
                         "as a candidate) unless M x its busiest rank's work exceeds the best so far by this fraction: "
                         "the best few candidates are refined layer by layer and replayed in full, which can reorder "
                         "them (GPT-3 175B on 64 A100s, Korthikanti et al.'s batch: the v = 4 plan is 1.9% faster "
                         "refined than the v = 2 plan, 3-5% slower on the groups)"},
    )
    budget_refine_slack: float = field(
        default=0.2,
        metadata={"doc": "on a grouped profile, the memory objective's budget (10% over the fastest, or the time "
                         "budget) is widened by this fraction for the candidates over groups of layers, which are "
                         "refined before it chooses: a heuristic (on a drawn ResNet-18 of 71 layers the leanest plan within "
                         "the budget was lost at 0.05 and kept at 0.1); the ME objective's figures (least time x memory, "
                         "fastest) are widened alike there for which configurations are solved, while which of their "
                         "candidates are built is decided by floors over the layers (planner.solve.grouped_builds)"},
    )
    refine_radius: int = field(
        default=4, metadata={"doc": "layers on each side of a coarse boundary that the refinement plans one by one"}
    )
    replicated_sizes: int = field(
        default=2, metadata={"doc": "micro-batch sizes (of the best uniform plans) for which per-stage replication is searched"}
    )
    replicated_max_devices: int = field(
        default=64,
        metadata={"doc": "most devices per-stage replication is searched for: its DP is over (layer, devices used), "
                         "O(L^2 x N x copy counts) per cap; on 1,024 devices that took ~80 s (GPT-3 175B), while the "
                         "clusters PipeDream's optimizer was built for (and evaluated on) have at most a few dozen"},
    )
    working_set_bytes: int = field(
        default=2 * 2**30,
        metadata={"doc": "ceiling on the stage tables' estimated bytes (planner.solve.ceiling), checked before they "
                         "are built: a longer chain is coarsened into blocks, or the request refused; 2 GiB keeps "
                         "the process under about 3 GB (the profile, its views and the simulations besides)"},
    )


SETTINGS = SearchSettings()
