"""Which candidates of a search over groups of layers the ME objective builds plans for, decided
by bounds over the layers themselves and the plans already built, not by the groups' own figures.

Over groups of layers (a profile longer than ``chain_max``) a candidate's figures are not its
plan's: :func:`planner.solve.coarsen.refine` re-solves its configuration over single layers
around its boundaries (its time and memory then either way: on the resnet fixture, 8 V100s,
2 GiB, a stage at layer 70, a candidate simulates 81.92 ms over groups and its plan 64.96 ms),
and a tighter cap's candidate is mapped to the layers (:func:`planner.solve.coarsen.to_layers`,
its recomputation chosen again). So the groups' figures neither bound a plan nor are one: the
ME objective used them widened by ``budget_refine_slack`` (a heuristic that lost that plan).

Instead (a branch and bound over the candidates, the most promising first):

- the incumbent, :class:`Built`, holds only what plans actually built reach: the least
  ``t x m`` (iteration time x peak memory: the ME objective's choice has the least), the fastest
  time and the fastest on all the devices (shared by every degree and cap of the request);
- a refined candidate's plan is a plan of the candidate's own configuration ``c`` over the
  layers (refinement keeps ``c``: its layout, micro-batch size, schedule and sharding), so it is
  no faster than ``c``'s time floor over the layers and peaks no lower than ``c``'s memory floor
  over the layers (:class:`LayerFloors`); it is refined and built only where those could still
  hold the incumbent (:meth:`Built.could_hold`), else no plan of it could;
- a mapped candidate (a tighter cap's) is mapped and simulated first (no re-solve: cheap), so
  its time is its plan's and its largest stage's peak is at most its plan's: built only where
  those could hold the incumbent.

A candidate is skipped only when no plan it gives can be the objective's choice, the fastest
(where the index has no reference plan) or the fastest on all the devices, so the plans chosen
among are those the search without pruning chooses among, of the candidates the search over
groups found (which configurations that search solves is still pruned by the groups' figures
widened: :meth:`planner.solve.objectives.MePolicy.for_groups`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.artifacts.plan import Plan
from planner.artifacts.request import PlanRequest
from planner.cost import CostModel
from planner.solve.floors import ConfigFacts
from planner.solve.space import Config

#: the ME objective's memory figures agree to this fraction: a stage's peak (its parts each rounded
#: to bytes) against its plan's (rounded once), e.g. 1,073,456,098 against 1,073,456,096 bytes
BYTES_SLACK = 1e-6


@dataclass(slots=True)
class Built:
    """What the plans built so far for an ME request reach (every degree's, every cap's):
    ``product`` the least iteration time x peak memory of one, ``fastest_ms`` the least time,
    ``fastest_all_ms`` the least time of one on all the devices. Each is a plan's own figure,
    so the objective's choice is at least as good."""

    product: float = math.inf
    fastest_ms: float = math.inf
    fastest_all_ms: float = math.inf

    def note(self, plan: Plan, on_all: bool) -> None:
        t = plan.predicted.iteration_ms
        self.product = min(self.product, t * plan.predicted.peak_memory_bytes)
        self.fastest_ms = min(self.fastest_ms, t)
        if on_all:
            self.fastest_all_ms = min(self.fastest_all_ms, t)

    def note_plans(self, plans: list[Plan]) -> None:
        """Each of ``plans`` noted (:meth:`note`; on all the devices where it uses every one available)."""
        for p in plans:
            self.note(p, p.num_devices == p.devices_available)

    def could_hold(self, time_ms: float, memory_bytes: float, on_all: bool, referenced: bool) -> bool:
        """A plan no faster than ``time_ms`` and peaking no lower than ``memory_bytes`` could be
        the objective's choice (its product at most the least built: ties are built, so the
        choice's tie-break is the search without pruning's), the fastest where the index has
        no reference plan (``referenced`` False: the index counts from it), or the fastest on
        all the devices (``on_all``: the plan records it). Relative slack: 1e-6 on the product
        (a plan's bytes against its stages'), 1e-9 on times."""
        if time_ms * memory_bytes <= self.product * (1 + BYTES_SLACK):
            return True
        slack = 1 + 1e-9
        return (not referenced and time_ms <= self.fastest_ms * slack) or (
            on_all and time_ms <= self.fastest_all_ms * slack)


class LayerFloors:
    """Floors over the layers of ``cm`` (the profile itself, not its groups) of every plan of a
    configuration that fits ``cap_bytes`` per device, whatever its partition, recomputation and
    ZeRO variant (:class:`planner.solve.floors.ConfigFacts`, on the layers):

    - time: the most of the average-work bound and the fill of a one-chunk pipeline
      (:meth:`ConfigFacts.bound`; interleaved: :func:`planner.solve.floors.chunk_fill_bound_ms`
      on the first layers themselves), the recomputation a rank must do to fit ``cap_bytes``
      (:meth:`ConfigFacts.memory_bound`), and ``M x`` the least work of the busiest rank holding
      whole layers (:meth:`ConfigFacts.rank_floor_ms`);
    - memory: the model state's share of a rank and the least over partitions of the largest
      stage's fewest bytes at its leanest recomputation (:meth:`ConfigFacts.memory_floor_once`).

    A plan under a tighter cap also fits ``cap_bytes``: the same floors hold for it. Per-stage
    replication (a stage's copies sharing its micro-batches) is not bounded here: 0 both (its
    candidates are always built, as without pruning)."""

    def __init__(self, cm: CostModel, request: PlanRequest, cap_bytes: float) -> None:
        self.facts = ConfigFacts(cm, request, cap_bytes)
        self.recompute = request.recompute
        self.times: dict[Config, float] = {}

    def time_ms(self, c: Config) -> float:
        if c.layout.stage_replicas:
            return 0.0
        found = self.times.get(c)
        if found is None:
            facts = self.facts
            found = max(facts.bound(c, True), facts.rank_floor_ms(c, 1.0),
                        facts.memory_bound(c) if self.recompute else 0.0)
            self.times[c] = found
        return found

    def memory_bytes(self, c: Config) -> float:
        return self.facts.memory_floor_once(c)
