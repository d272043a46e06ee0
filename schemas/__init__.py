"""Pydantic contracts shared by every stage (no torch here).

The Lance/Arrow schemas of the experience store are derived from these models in one place,
:func:`schemas.arrow.arrow_schema`.
"""
from schemas.skills import SkillRecord
from schemas.trajectory import Message, RunManifest, Task, ToolCall, Trajectory, Turn

__all__ = ["Message", "RunManifest", "SkillRecord", "Task", "ToolCall", "Trajectory", "Turn"]
