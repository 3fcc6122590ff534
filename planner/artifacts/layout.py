"""The Layout: a plan's parallel dimensions, in one frozen value.

It plays the role torchtitan's ``ParallelDims`` plays: every axis a plan splits its devices
along, the rank each device takes, the device mesh, and the checks that hold between them.
The cost model prices a stage under a Layout, the solver searches Layouts, a Plan, its run
report and the runtime's device mesh all hold or come from one.

Axes (the mesh's dimensions, outermost first):

- ``pp``: pipeline ranks. ``num_stages`` model chunks run on ``pipeline_size`` =
  ``num_stages / virtual_stages_per_rank`` ranks; pipeline rank ``p`` holds chunks ``p``,
  ``p + pipeline_size``, ... (interleaved 1F1B, Narayanan et al. 2021; v = 1 otherwise), or,
  with ``placement`` ``v``, chunks ``p`` and ``2 pipeline_size - 1 - p`` (ZBV, Qi et al. 2024
  sec. 6; see :class:`~planner.artifacts.kinds.ChunkPlacement`). :meth:`Layout.pipeline_rank`
  is the one formula for both;
- ``dp``: ``dp_degree`` replicated pipelines, the global batch split between them;
- ``cp``: ``cp_degree`` devices split each sample's sequence (context parallelism, as Llama 3
  trains long contexts: keys and values all-gathered over the group, the causal sequence cut
  into 2 cp chunks, rank i holding chunks i and 2 cp - 1 - i). Parameters are replicated over
  the cp ranks; a micro-batch is the same samples on all of them;
- ``tp``: ``tp_degree`` devices of one node run each stage replica together (Megatron-LM,
  Shoeybi et al. 2019), with ``sequence_parallel`` splitting the rest along the sequence
  (Korthikanti et al. 2022).

Two more properties of the data-parallel axis: ``zero`` (ZeRO, Rajbhandari et al. 2020: the
model state sharded over a stage's data-parallel ranks) and ``stage_replicas`` (PipeDream's
per-stage replication, Narayanan et al. 2019: stage ``s`` has its own ``R_s`` copies inside one
pipeline, micro-batch ``m`` on copy ``m mod R_s``; with ``dp_degree`` 1, ``tp_degree`` 1, one
chunk per rank).

Experts (mixture-of-experts layers, "parallel folding": Liu et al. 2025, "MoE Parallel Folding",
arXiv 2504.14960; Megatron-Core's ``--expert-model-parallel-size`` /
``--expert-tensor-parallel-size``): the routed experts of every MoE layer are laid out apart from
attention, over the same ranks. A pipeline rank's ``tp x cp x dp`` devices are, for the experts,
``etp_degree`` (expert tensor parallelism: each expert's weights split, innermost) x
``ep_degree`` (expert parallelism: the experts divided) x ``edp_degree`` (expert data
parallelism, derived: ``tp x cp x dp / (ep x etp)``, over which the experts' gradients are
synchronised and their ZeRO state sharded). The expert rank formula, Megatron-Core's expert
``RankGenerator`` order "tp-ep-dp-pp": within pipeline rank ``p``'s block of ``n = dp x cp x tp``
consecutive ranks, ``rank = p x n + (edp_index x ep + ep_index) x etp + etp_index`` (an expert
mesh ("pp", "edp", "ep", "etp") of shape ``(pipeline_size, edp, ep, etp)``; ranks of the
attention mesh and the expert mesh are the same devices, numbered alike).

Gradients are synchronised, and ZeRO state sharded, over a stage's data-parallel and
context-parallel ranks together (:meth:`Layout.grad_group`, as torchtitan's ``dp_shard_cp``):
the cp ranks hold the same parameters and each computes gradients of its part of the sequence.

Ranks: a uniform layout is the row-major ("pp", "dp", "cp", "tp") mesh of shape
``(pipeline_size, dp_degree, cp_degree, tp_degree)``: ``rank = ((p x dp_degree + replica) x
cp_degree + cp_index) x tp_degree + tp_index``, so a tensor-parallel group is consecutive ranks
(inside a node) and a context-parallel group the next-nearest (torchtitan's order). A layout
replicated per stage places the stages' copies in consecutive blocks, stage 0's first: copy
``r`` of stage ``s`` is rank ``R_0 + ... + R_{s-1} + r``.

Adding an axis: a field here (with its check in ``__post_init__`` and its place in
``rank_of``, ``mesh_shape`` and ``MESH_DIMS``), its terms in the cost model, and its entry in
the solver's list of dimensions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.artifacts.caches import Cache
from planner.artifacts.expert_ranks import EXPERT_MESH_DIMS as EXPERT_MESH_DIMS  # the mesh dims, beside MESH_DIMS
from planner.artifacts.expert_ranks import ExpertRanks
from planner.artifacts.kinds import ChunkPlacement, ZeroStage

#: the mesh dimensions of a uniform layout, outermost first
MESH_DIMS = ("pp", "dp", "cp", "tp")


#: Layout.stage_ranks by (layout, stage)
_STAGE_RANKS: Cache[tuple[Layout, int], tuple[int, ...]] = Cache(
    "artifacts.layout.stage_ranks", key="(layout, stage index)", bound=1 << 10)


@dataclass(frozen=True, slots=True)
class Sharding:
    """How one stage's model state is divided: ZeRO stage ``zero`` over ``ranks`` data-parallel
    ranks (1 when nothing is sharded); the routed experts' state over ``expert_ranks`` (the
    stage's expert data-parallel group, :attr:`Layout.edp_degree`; 0: the same as ``ranks``,
    a layout without expert parallelism)."""

    zero: ZeroStage = ZeroStage.NONE
    ranks: int = 1
    expert_ranks: int = 0
    #: HSDP: the groups of ``ranks`` that each hold a whole copy of the sharded state (1: plain ZeRO)
    replicas: int = 1

    @property
    def expert_shards(self) -> int:
        """Ranks the routed experts' state is divided over (``ranks`` unless told)."""
        return self.expert_ranks or self.ranks


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceGroup:
    """The devices one stage replica spans, the mesh's innermost axes: ``cp_degree`` context-
    parallel groups of ``tp_degree`` tensor-parallel devices (with ``sequence_parallel``). The
    solver searches one cost model per group (:meth:`Layout.group` of every layout it prices),
    and counts layouts in groups (``devices // size``). Ranks: a tensor-parallel group is
    consecutive ranks, its context-parallel neighbours ``tp_degree`` apart (:attr:`strides`)."""

    tp_degree: int = 1
    cp_degree: int = 1
    sequence_parallel: bool = False
    ep_degree: int = 1
    etp_degree: int = 1

    def __post_init__(self) -> None:
        if self.tp_degree < 1:
            raise ValueError(f"tp_degree must be >= 1 (got {self.tp_degree})")
        if self.cp_degree < 1:
            raise ValueError(f"cp_degree must be >= 1 (got {self.cp_degree})")
        if self.sequence_parallel and self.tp_degree == 1:
            raise ValueError("sequence_parallel needs tp_degree > 1")
        if self.ep_degree < 1 or self.etp_degree < 1:
            raise ValueError(f"ep_degree and etp_degree must be >= 1 (got {self.ep_degree}, {self.etp_degree})")

    @property
    def experts_size(self) -> int:
        """Devices one expert's copy is split over across its experts: ``ep x etp``."""
        return self.ep_degree * self.etp_degree

    @property
    def dp_multiple(self) -> int:
        """The data-parallel degrees a layout of this group may have are the multiples of this:
        ``ep x etp`` must divide ``tp x cp x dp`` (the experts folded over a pipeline rank's
        ranks, :attr:`Layout.edp_degree`)."""
        return self.experts_size // math.gcd(self.experts_size, self.size)

    def admits(self, dp_degree: int) -> bool:
        """Whether a layout of this group may have ``dp_degree`` replicated pipelines."""
        return dp_degree % self.dp_multiple == 0

    @property
    def size(self) -> int:
        """Devices in the group: ``tp_degree x cp_degree``."""
        return self.tp_degree * self.cp_degree

    @property
    def strides(self) -> tuple[int, int]:
        """Rank distance between neighbours along (cp, tp) inside the group."""
        return self.tp_degree, 1

    def groups_in(self, num_devices: int) -> int:
        """Whole groups in ``num_devices`` devices."""
        return num_devices // self.size

    def layout(
        self, *, num_stages: int, virtual_stages_per_rank: int = 1, dp_degree: int = 1,
        stage_replicas: tuple[int, ...] = (), zero: ZeroStage = ZeroStage.NONE,
        placement: ChunkPlacement = ChunkPlacement.LOOP,
    ) -> Layout:
        """The layout of stages spanning this group each (the other axes as given)."""
        return Layout(num_stages=num_stages, virtual_stages_per_rank=virtual_stages_per_rank, dp_degree=dp_degree,
                      stage_replicas=stage_replicas, tp_degree=self.tp_degree, cp_degree=self.cp_degree,
                      sequence_parallel=self.sequence_parallel, zero=zero, placement=placement,
                      ep_degree=self.ep_degree, etp_degree=self.etp_degree)

    def describe(self) -> str:
        """``tensor-parallel degree 2 (seq-par), context-parallel 4`` (progress notes); with
        experts ``..., expert-parallel 8 (expert tensor-parallel 2)``."""
        sp = " (seq-par)" if self.sequence_parallel else ""
        cp = f", context-parallel {self.cp_degree}" if self.cp_degree > 1 else ""
        ep = f", expert-parallel {self.ep_degree}" if self.experts_size > 1 else ""
        etp = f" (expert tensor-parallel {self.etp_degree})" if self.etp_degree > 1 else ""
        return f"tensor-parallel degree {self.tp_degree}{sp}{cp}{ep}{etp}"


#: the group of one device (no tensor or context parallelism)
ONE_DEVICE = DeviceGroup()


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout(ExpertRanks):
    """A plan's parallel dimensions (see the module docstring)."""

    num_stages: int = field(metadata={"doc": "model chunks (pipeline stages) in all"})
    virtual_stages_per_rank: int = field(default=1, metadata={"doc": "chunks per pipeline rank (interleaved: > 1)"})
    dp_degree: int = field(default=1, metadata={"doc": "replicated pipelines D"})
    stage_replicas: tuple[int, ...] = field(
        default=(), metadata={"doc": "copies of each stage inside one pipeline (PipeDream); () = one each"}
    )
    tp_degree: int = field(default=1, metadata={"doc": "tensor-parallel devices per stage replica t"})
    cp_degree: int = field(
        default=1,
        metadata={"doc": "context-parallel devices per stage replica: each sample's sequence split over them "
                         "(absent from a plan file when 1)", "omit_if_default": True},
    )
    sequence_parallel: bool = field(default=False, metadata={"doc": "the rest of the activations split along the sequence"})
    zero: ZeroStage = field(default=ZeroStage.NONE, metadata={"doc": "ZeRO stage over a stage's data-parallel ranks"})
    placement: ChunkPlacement = field(
        default=ChunkPlacement.LOOP,
        metadata={"doc": "which chunks a rank holds: loop (p, p + P, ...), v (p, 2P - 1 - p, ...; ZBV), mirror (DualPipe)"},
    )
    ep_degree: int = field(
        default=1,
        metadata={"doc": "expert-parallel devices: the routed experts of every MoE layer divided over them "
                         "(absent from a plan file when 1)", "omit_if_default": True},
    )
    etp_degree: int = field(
        default=1,
        metadata={"doc": "expert tensor-parallel devices: each routed expert's weights split over them "
                         "(absent from a plan file when 1)", "omit_if_default": True},
    )
    shard_group_size: int = field(default=0, metadata={
        "doc": "HSDP under ZeRO 3: the state sharded over this many consecutive ranks of a stage's gradient group, "
               "replicated across the groups (planner.cost.fsdp.hsdp_groups); 0 = the whole group (absent when 0)",
        "omit_if_default": True})

    def __post_init__(self) -> None:
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1 (got {self.num_stages})")
        v = self.virtual_stages_per_rank
        if v < 1 or self.num_stages % v:
            raise ValueError(f"virtual_stages_per_rank {v} must be >= 1 and divide num_stages {self.num_stages}")
        if self.dp_degree < 1:
            raise ValueError(f"dp_degree must be >= 1 (got {self.dp_degree})")
        if self.tp_degree < 1:
            raise ValueError(f"tp_degree must be >= 1 (got {self.tp_degree})")
        if self.cp_degree < 1:
            raise ValueError(f"cp_degree must be >= 1 (got {self.cp_degree})")
        if self.sequence_parallel and self.tp_degree == 1:
            raise ValueError("sequence_parallel needs tp_degree > 1")
        object.__setattr__(self, "zero", ZeroStage(self.zero))
        object.__setattr__(self, "placement", ChunkPlacement(self.placement))
        mirror = self.placement is ChunkPlacement.MIRROR and (v != 2 or self.dp_degree % 2)
        if self.placement is not ChunkPlacement.LOOP and (v % 2 or mirror):
            raise ValueError(f"a {self.placement.value} placement needs an even virtual_stages_per_rank "
                             f"(mirror: 2, and an even dp_degree: its two copies; got {v}, D={self.dp_degree})")
        reps = tuple(self.stage_replicas)
        if reps:
            if len(reps) != self.num_stages:
                raise ValueError(f"stage_replicas has {len(reps)} entries for {self.num_stages} stages")
            if min(reps) < 1:
                raise ValueError(f"stage_replicas must be >= 1 (got {list(reps)})")
            if max(reps) == 1:
                reps = ()  # one copy each is the uniform layout
        if reps and (v > 1 or self.dp_degree > 1 or self.tp_degree > 1 or self.cp_degree > 1):
            raise ValueError(
                f"per-stage replication (replicas {list(reps)}) needs one stage per rank, dp_degree 1, tp_degree 1 "
                f"and cp_degree 1 (got virtual_stages_per_rank {v}, dp_degree {self.dp_degree}, "
                f"tp_degree {self.tp_degree}, cp_degree {self.cp_degree})"
            )
        object.__setattr__(self, "stage_replicas", reps)
        g, whole = self.shard_group_size, self.dp_degree * self.cp_degree
        if g and (self.zero is not ZeroStage.PARAMETERS or reps or g < 1 or g >= whole or whole % g):
            raise ValueError(f"shard_group_size {g} needs ZeRO 3, a uniform layout and a proper divisor of the "
                             f"gradient group's {whole} ranks (got zero {int(self.zero)})")
        self._check_experts()

    def _check_experts(self) -> None:
        """The experts' layout folds over each pipeline rank's ranks (module docstring)."""
        ep, etp = self.ep_degree, self.etp_degree
        if ep < 1 or etp < 1:
            raise ValueError(f"ep_degree and etp_degree must be >= 1 (got {ep}, {etp})")
        if ep * etp == 1:
            return
        if self.stage_replicas:
            raise ValueError(f"per-stage replication (replicas {list(self.stage_replicas)}) needs ep_degree 1 and "
                             f"etp_degree 1 (got {ep}, {etp})")
        ranks = self.tp_degree * self.cp_degree * self.dp_degree
        if ranks % (ep * etp):
            raise ValueError(f"ep_degree {ep} x etp_degree {etp} must divide a pipeline rank's tp_degree x cp_degree "
                             f"x dp_degree = {self.tp_degree} x {self.cp_degree} x {self.dp_degree} = {ranks} devices")

    # ---------------------------------------------------------------- sizes
    @property
    def group(self) -> DeviceGroup:
        """The devices one stage replica spans (tensor x context parallel), with the expert
        degrees its cost model prices."""
        return DeviceGroup(tp_degree=self.tp_degree, cp_degree=self.cp_degree,
                           sequence_parallel=self.sequence_parallel, ep_degree=self.ep_degree,
                           etp_degree=self.etp_degree)

    @property
    def num_groups(self) -> int:
        """Groups (:attr:`group`) the layout occupies: P x D, or the sum of the stages' copies."""
        return self.world_size // (self.tp_degree * self.cp_degree)

    @property
    def pipeline_size(self) -> int:
        """Pipeline ranks per replica: ``num_stages / virtual_stages_per_rank``."""
        return self.num_stages // self.virtual_stages_per_rank

    @property
    def replicated_per_stage(self) -> bool:
        return bool(self.stage_replicas)

    @property
    def world_size(self) -> int:
        """Devices the layout occupies."""
        if self.stage_replicas:
            return sum(self.stage_replicas)
        return self.pipeline_size * self.dp_degree * self.cp_degree * self.tp_degree

    @property
    def mesh_shape(self) -> tuple[int, int, int, int]:
        """The ("pp", "dp", "cp", "tp") mesh of a uniform layout."""
        if self.stage_replicas:
            raise ValueError(f"a layout replicated per stage (replicas {list(self.stage_replicas)}) is not a mesh")
        return (self.pipeline_size, self.dp_degree, self.cp_degree, self.tp_degree)

    def replicas_of(self, stage_idx: int) -> int:
        """Copies of stage ``stage_idx`` inside one pipeline (1 unless replicated per stage)."""
        return self.stage_replicas[stage_idx] if self.stage_replicas else 1

    def data_parallel_size(self, stage_idx: int) -> int:
        """Ranks of stage ``stage_idx`` that split the global batch between them, at one cp and
        tp index (replicated pipelines x copies)."""
        return self.dp_degree * self.replicas_of(stage_idx)

    def grad_group_size(self, stage_idx: int) -> int:
        """Ranks holding the same shard of stage ``stage_idx``: its gradients are synchronised
        and its ZeRO state sharded over them (data-parallel x context-parallel ranks)."""
        return self.data_parallel_size(stage_idx) * self.cp_degree

    def sharding(self, stage_idx: int) -> Sharding:
        """How stage ``stage_idx``'s model state is divided under ``zero`` (the experts' over
        their expert data-parallel group, where the layout has expert parallelism)."""
        if self.zero is ZeroStage.NONE:
            return Sharding()
        ranks, experts = self.grad_group_size(stage_idx), self.expert_grad_group_size(stage_idx)
        g = self.shard_group_size or ranks  # HSDP: sharded inside each group of g, replicated across them
        return Sharding(self.zero, g, experts if experts != ranks else 0, replicas=ranks // g)

    # ---------------------------------------------------------------- ranks
    def pipeline_rank(self, stage_idx: int) -> int:
        """The pipeline rank running chunk ``stage_idx``: round-robin when interleaved, going
        back up the ranks in odd rounds under a V placement (torch's "v" style)."""
        p = self.pipeline_size
        if self.placement is not ChunkPlacement.LOOP and (stage_idx // p) % 2:
            return p - 1 - stage_idx % p
        return stage_idx % p

    def downstream_rank(self, stage_idx: int) -> int:
        """Where stage ``stage_idx``'s first device sends its output: the next stage's (DualPipe's turn: the other copy's)."""
        turn = self.placement is ChunkPlacement.MIRROR and stage_idx == self.pipeline_size - 1
        return self.rank_of(stage_idx=stage_idx, replica=1) if turn else self.rank_of(stage_idx=stage_idx + 1)

    def stage_indices(self, pipeline_rank: int) -> tuple[int, ...]:
        """The chunks pipeline rank ``pipeline_rank`` runs, in order: p, p + pipeline_size, ...
        (V placement: p, 2 pipeline_size - 1 - p, ...)."""
        p, r, up = self.pipeline_size, pipeline_rank, self.placement is not ChunkPlacement.LOOP  # (V: odd rounds go back up)
        return tuple(s for k in range(-(-self.num_stages // p)) if (s := k * p + (p - 1 - r if up and k % 2 else r)) < self.num_stages)

    def rank_of(self, *, stage_idx: int, replica: int = 0, cp_index: int = 0, tp_index: int = 0) -> int:
        """The rank of copy ``replica`` (replicated pipeline, or copy inside the pipeline when
        replicated per stage) of stage ``stage_idx``, context-parallel part ``cp_index``,
        tensor-parallel shard ``tp_index``."""
        if not 0 <= stage_idx < self.num_stages:
            raise ValueError(f"stage {stage_idx} is not one of the {self.num_stages} stages")
        if (not 0 <= replica < self.data_parallel_size(stage_idx) or not 0 <= cp_index < self.cp_degree
                or not 0 <= tp_index < self.tp_degree):
            raise ValueError(f"stage {stage_idx} has no replica {replica} / cp index {cp_index} / tp index {tp_index}")
        if self.stage_replicas:
            return sum(self.stage_replicas[:stage_idx]) + replica
        row = self.pipeline_rank(stage_idx) * self.dp_degree + replica
        return (row * self.cp_degree + cp_index) * self.tp_degree + tp_index

    def _ranks(self, stage_idx: int, replicas: range, cps: range, tps: range) -> tuple[int, ...]:
        """:meth:`rank_of` over the product of ``replicas``, ``cps`` and ``tps`` (in that order),
        their ranges checked once instead of per rank."""
        if not 0 <= stage_idx < self.num_stages:
            raise ValueError(f"stage {stage_idx} is not one of the {self.num_stages} stages")
        for name, got, size in (("replica", replicas, self.data_parallel_size(stage_idx)),
                                ("cp index", cps, self.cp_degree), ("tp index", tps, self.tp_degree)):
            if len(got) and not (0 <= got[0] and got[-1] < size):
                raise ValueError(f"stage {stage_idx} has no {name} {got[0] if got[0] < 0 else got[-1]}")
        if self.stage_replicas:
            first = sum(self.stage_replicas[:stage_idx])
            return tuple(first + r for r in replicas for _ in cps for _ in tps)
        row, cp, tp = self.pipeline_rank(stage_idx) * self.dp_degree, self.cp_degree, self.tp_degree
        return tuple(((row + r) * cp + c) * tp + k for r in replicas for c in cps for k in tps)

    def stage_ranks(self, stage_idx: int) -> tuple[int, ...]:
        """Every device of stage ``stage_idx``, in rank order (kept per layout and stage: a plan
        lists them, and checks them against this, for every stage)."""
        key = (self, stage_idx)
        found = _STAGE_RANKS.get(key)
        if found is None:
            found = _STAGE_RANKS.put(key, self._ranks(stage_idx, range(self.data_parallel_size(stage_idx)),
                                                      range(self.cp_degree), range(self.tp_degree)))
        return found

    def dp_group(self, stage_idx: int, tp_index: int = 0, cp_index: int = 0) -> tuple[int, ...]:
        """The ranks of stage ``stage_idx`` at context-parallel index ``cp_index`` and
        tensor-parallel index ``tp_index``: the replicas that split the global batch."""
        return self._ranks(stage_idx, range(self.data_parallel_size(stage_idx)), range(cp_index, cp_index + 1),
                           range(tp_index, tp_index + 1))

    def cp_group(self, stage_idx: int, replica: int = 0, tp_index: int = 0) -> tuple[int, ...]:
        """The ranks that split the sequence of replica ``replica`` of stage ``stage_idx`` at
        tensor-parallel index ``tp_index`` (keys and values are gathered over them)."""
        return self._ranks(stage_idx, range(replica, replica + 1), range(self.cp_degree), range(tp_index, tp_index + 1))

    def grad_group(self, stage_idx: int, tp_index: int = 0) -> tuple[int, ...]:
        """The ranks of stage ``stage_idx`` holding tensor-parallel shard ``tp_index``, over every
        replica and cp index, in rank order: its gradients are synchronised (and ZeRO-sharded)
        over them (:meth:`grad_group_size` ranks)."""
        return self._ranks(stage_idx, range(self.data_parallel_size(stage_idx)), range(self.cp_degree),
                           range(tp_index, tp_index + 1))

    def all_stage_ranks(self) -> tuple[tuple[int, ...], ...]:
        return tuple(self.stage_ranks(s) for s in range(self.num_stages))

    def coordinates(self, rank: int) -> tuple[int, int, int, int]:
        """(pipeline rank, replica, cp index, tp index) of ``rank`` in a uniform layout (the
        inverse of :meth:`rank_of`); a layout replicated per stage: (stage, copy, 0, 0)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the layout's {self.world_size} devices")
        if self.stage_replicas:
            offset = 0
            for s, copies in enumerate(self.stage_replicas):
                if rank < offset + copies:
                    return s, rank - offset, 0, 0
                offset += copies
        t, c, d = self.tp_degree, self.cp_degree, self.dp_degree
        return rank // (d * c * t), (rank // (c * t)) % d, (rank // t) % c, rank % t

    def describe(self, *, pipeline_ranks: bool = False) -> str:
        """The layout as tables and figures name it (the one place this text is built):
        ``P=4 x D=2, ZeRO-1``; with tensor parallelism ``T=2 (seq-par) x P=4 x D=1, ZeRO-1``;
        with context parallelism ``T=8 x CP=4 x P=2 x D=4, ZeRO-1`` (the axes inside a stage
        replica first);
        replicated per stage ``P=3 replicated 2+1+1, no ZeRO``. P counts stages; with
        ``pipeline_ranks`` an interleaved layout names its ranks:
        ``8 stages on P=4 pipeline ranks (2 each) x D=1, no ZeRO``."""
        zero = "no ZeRO" if self.zero is ZeroStage.NONE else f"ZeRO-{int(self.zero)}"
        if self.shard_group_size:
            zero += f" HSDP (shards of {self.shard_group_size})"
        v = self.virtual_stages_per_rank
        if pipeline_ranks and v > 1:
            shape = {ChunkPlacement.V: ", in a V", ChunkPlacement.MIRROR: ", in a V, D counting DualPipe's copies"}.get(self.placement, "")
            text = f"{self.num_stages} stages on P={self.pipeline_size} pipeline ranks ({v} each{shape}) x D={self.dp_degree}"
        elif self.stage_replicas:
            text = f"P={self.num_stages} replicated {'+'.join(map(str, self.stage_replicas))}"
        else:
            text = f"P={self.num_stages} x D={self.dp_degree}"
        if self.cp_degree > 1:
            text = f"CP={self.cp_degree} x {text}"
        if self.tp_degree > 1:
            text = f"T={self.tp_degree}{' (seq-par)' if self.sequence_parallel else ''} x {text}"
        if self.ep_degree * self.etp_degree > 1:
            text = f"{text}, experts EP={self.ep_degree} x ETP={self.etp_degree} x EDP={self.edp_degree}"
        return f"{text}, {zero}"
