"""The documents that flow through the planner: Profile, Cluster, PlanRequest, Plan."""

from planner.artifacts.cluster import PRESETS, Cluster, load_cluster, save_cluster
from planner.artifacts.plan import Plan, PlanStage, StageMemory, load_plan, save_plan
from planner.artifacts.plan_summary import ParetoPoint, Prediction, Provenance
from planner.artifacts.profile import Edge, Layer, Profile, TiedParams, TimeFit, TimePoint, load_profile, save_profile
from planner.artifacts.request import Objective, OptimizerKind, PlanRequest, ScheduleKind
from planner.artifacts.tensor_split import TensorSplit

__all__ = [
    "PRESETS", "Cluster", "Edge", "Layer", "Objective", "OptimizerKind", "ParetoPoint", "Plan",
    "PlanRequest", "PlanStage", "Prediction", "Profile", "Provenance", "ScheduleKind", "StageMemory",
    "TensorSplit", "TiedParams", "TimeFit", "TimePoint", "load_cluster", "load_plan", "load_profile", "save_cluster",
    "save_plan", "save_profile",
]
