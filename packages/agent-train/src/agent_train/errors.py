"""Exceptions of agent-train, one per boundary.

Inside a rollout nothing here is raised for what the model, a tool or the engine did: those are recorded on the
trajectory and show up in `extra_logs`. These errors are for callers: a recipe that cannot be found, a dataset
row that cannot be trained on, a launch that OpenRLHF would reject.
"""

from __future__ import annotations

__all__ = ["DatasetError", "LaunchError", "TrainError"]


class TrainError(Exception):
    """Base class of every error agent-train raises."""


class DatasetError(TrainError, ValueError):
    """A dataset row cannot be turned into an OpenRLHF prompt; the message names the file, the line and the field."""


class LaunchError(TrainError):
    """An OpenRLHF launch cannot be built or was rejected (by our checks or by OpenRLHF's own argument parser)."""
