"""The embedded default: the profile ``planner plan`` uses when given none."""

from __future__ import annotations

from pathlib import Path

from planner.artifacts.profile import Profile, load_profile

#: GPT-3 13B (analytic, A100-80GB): it needs pipeline parallelism on one 8-GPU node.
DEFAULT_PROFILE = "gpt3-13b-a100.json"
DEFAULT_GLOBAL_BATCH = 512


def profiles_dir() -> Path:
    """The repository's ``profiles/`` folder (shipped profiles)."""
    return Path(__file__).resolve().parents[2] / "profiles"


def default_profile_path() -> Path:
    return profiles_dir() / DEFAULT_PROFILE


def default_profile() -> Profile:
    """The shipped default profile; rebuilt from its formulas when the package is installed
    without the repository's ``profiles/`` folder (the two are identical, a test checks it)."""
    path = default_profile_path()
    if path.exists():
        return load_profile(path)
    from planner.profiling.analytic.gpt import gpt3_profile  # only here: the formulas cost imports

    return gpt3_profile("gpt3-13b", "a100-80gb")
