"""The routed experts' ranks of a :class:`~planner.artifacts.layout.Layout` ("parallel folding":
Liu et al. 2025, arXiv 2504.14960; Megatron-Core's expert ``RankGenerator``, order
"tp-ep-dp-pp"): within pipeline rank ``p``'s block of ``n = dp x cp x tp`` consecutive ranks,

    rank = p x n + (edp_index x ep + ep_index) x etp + etp_index,

an expert mesh ("pp", "edp", "ep", "etp") of shape ``(pipeline_size, edp, ep, etp)`` over the
same devices as the attention mesh ("pp", "dp", "cp", "tp"). A base class of ``Layout`` (one
job: the expert axes' ranks), over the attributes the Layout sets."""

from __future__ import annotations

__all__ = ["EXPERT_MESH_DIMS", "ExpertRanks"]

#: the mesh dimensions of the layout's ranks as the routed experts see them, outermost first
EXPERT_MESH_DIMS = ("pp", "edp", "ep", "etp")


class ExpertRanks:
    """The expert axes' rank formula, groups and mesh (module docstring)."""

    __slots__ = ()

    num_stages: int
    dp_degree: int
    tp_degree: int
    cp_degree: int
    ep_degree: int
    etp_degree: int
    stage_replicas: tuple[int, ...]

    @property
    def world_size(self) -> int:
        raise NotImplementedError

    @property
    def mesh_shape(self) -> tuple[int, int, int, int]:
        raise NotImplementedError

    @property
    def pipeline_size(self) -> int:
        raise NotImplementedError

    def pipeline_rank(self, stage_idx: int) -> int:
        raise NotImplementedError

    def grad_group_size(self, stage_idx: int) -> int:
        raise NotImplementedError

    @property
    def edp_degree(self) -> int:
        """Expert data-parallel devices: a pipeline rank's ``tp x cp x dp`` over ``ep x etp``."""
        return self.tp_degree * self.cp_degree * self.dp_degree // (self.ep_degree * self.etp_degree)

    @property
    def expert_mesh_shape(self) -> tuple[int, int, int, int]:
        """The ("pp", "edp", "ep", "etp") mesh of the same ranks as the experts see them."""
        _ = self.mesh_shape  # a uniform layout
        return (self.pipeline_size, self.edp_degree, self.ep_degree, self.etp_degree)

    def expert_grad_group_size(self, stage_idx: int) -> int:
        """Ranks holding the same shard of stage ``stage_idx``'s routed experts: their gradients
        are synchronised and their ZeRO state sharded over them (:attr:`edp_degree`; per-stage
        replication: the stage's copies)."""
        if self.stage_replicas:
            return self.grad_group_size(stage_idx)
        return self.edp_degree

    def expert_rank_of(self, *, stage_idx: int, edp_index: int = 0, ep_index: int = 0, etp_index: int = 0) -> int:
        """The rank holding expert shard ``etp_index`` of the experts of part ``ep_index``, in
        expert data-parallel copy ``edp_index``, of stage ``stage_idx`` (module docstring)."""
        if not 0 <= stage_idx < self.num_stages:
            raise ValueError(f"stage {stage_idx} is not one of the {self.num_stages} stages")
        if (not 0 <= edp_index < self.expert_grad_group_size(stage_idx) or not 0 <= ep_index < self.ep_degree
                or not 0 <= etp_index < self.etp_degree):
            raise ValueError(f"stage {stage_idx} has no edp index {edp_index} / ep index {ep_index} / "
                             f"etp index {etp_index}")
        if self.stage_replicas:
            return sum(self.stage_replicas[:stage_idx]) + edp_index
        block = self.dp_degree * self.cp_degree * self.tp_degree
        return self.pipeline_rank(stage_idx) * block + (edp_index * self.ep_degree + ep_index) * self.etp_degree + etp_index

    def expert_coordinates(self, rank: int) -> tuple[int, int, int, int]:
        """(pipeline rank, edp index, ep index, etp index) of ``rank`` in a uniform layout (the
        inverse of :meth:`expert_rank_of`)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the layout's {self.world_size} devices")
        _ = self.mesh_shape  # a uniform layout
        block = self.dp_degree * self.cp_degree * self.tp_degree
        r = rank % block
        return rank // block, r // (self.etp_degree * self.ep_degree), (r // self.etp_degree) % self.ep_degree, r % self.etp_degree

    def ep_group(self, stage_idx: int, edp_index: int = 0, etp_index: int = 0) -> tuple[int, ...]:
        """The ranks among which stage ``stage_idx``'s routed experts are divided (tokens are
        dispatched and combined over them), in rank order."""
        return tuple(self.expert_rank_of(stage_idx=stage_idx, edp_index=edp_index, ep_index=e, etp_index=etp_index)
                     for e in range(self.ep_degree))

    def etp_group(self, stage_idx: int, edp_index: int = 0, ep_index: int = 0) -> tuple[int, ...]:
        """The ranks one routed expert's weights are split over (consecutive ranks)."""
        return tuple(self.expert_rank_of(stage_idx=stage_idx, edp_index=edp_index, ep_index=ep_index, etp_index=k)
                     for k in range(self.etp_degree))

    def edp_group(self, stage_idx: int, ep_index: int = 0, etp_index: int = 0) -> tuple[int, ...]:
        """The ranks holding the same shard of stage ``stage_idx``'s routed experts: their
        gradients are synchronised and their ZeRO state sharded over them."""
        return tuple(self.expert_rank_of(stage_idx=stage_idx, edp_index=d, ep_index=ep_index, etp_index=etp_index)
                     for d in range(self.expert_grad_group_size(stage_idx)))
