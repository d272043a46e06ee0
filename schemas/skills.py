"""Rows of the Skill-SD skill bank: the ``skills`` table of the experience store.

Skill-SD (arXiv 2604.10674; B.1 of the LOPD paper) keeps, per task, LLM-written skill summaries
("what works / what to avoid / suggested workflow") and UCB1 statistics over them. The table is
an append-only event log, one :class:`SkillRecord` per event, so that every row belongs to the
training step that wrote it (a resumed run deletes the rows of steps after its checkpoint,
like the trajectories):

* ``kind="skill"``: a skill written at ``step`` for ``task_id`` (``text``, the trajectory ids
  it was written from in ``sources``, the model that wrote it in ``summarizer``).
* ``kind="use"``: skill ``skill_id`` was the teacher's context for ``task_id`` at ``step``.
* ``kind="credit"``: at ``step``, the task was played again after training with skill
  ``skill_id`` (its last use), and the skill is credited ``reward`` (the mean reward of that
  step's rollouts of the task).

A skill's UCB1 statistics are the count and mean reward of its ``credit`` rows.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SkillRecord(BaseModel):
    """One event of a run's skill bank (module docstring).

    Attributes:
        record_id: unique, deterministic: ``<run_id>-<step>-<kind>-<index>``.
        run_id: the training run that wrote it.
        step: the training step that wrote it (1-based).
        kind: ``"skill"`` (a new skill), ``"use"`` (a skill used) or ``"credit"`` (a use credited).
        env, task_id: the task the skill belongs to.
        skill_id: the skill (its own ``record_id`` on ``kind="skill"`` rows).
        text: the skill text (``kind="skill"``; empty when the summariser gave nothing).
        parsed: the summary had the three sections (else ``text`` is the raw summary).
        sources: trajectory ids the skill was written from (``kind="skill"``).
        summarizer: the model that wrote it (``kind="skill"``).
        reward: the credited reward (``kind="credit"``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    record_id: str
    run_id: str
    step: int = Field(ge=0)
    kind: Literal["skill", "use", "credit"]
    env: str
    task_id: str
    skill_id: str
    text: str = ""
    parsed: bool = False
    sources: list[str] = Field(default_factory=list)
    summarizer: str = ""
    reward: float = 0.0
