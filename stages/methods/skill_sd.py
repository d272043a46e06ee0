"""Skill-SD: GRPO plus a small self-distillation term from a teacher that reads a skill summary.

Skill-SD (arXiv 2604.10674) as in B.1 of the LOPD paper. No public code exists; the facts are B.1
and a third-party reading note of the paper (mostly unverified, see the choices below).

* Skill bank: per task, skill summaries ("what works / what to avoid / suggested workflow")
  written by an LLM from the task's rollouts: the backbone itself through the run's rollout
  engine (the current student), or ``summarizer`` = another local folder / HF id. Greedy,
  at most ``summary_max_tokens`` tokens, prompt capped at ``summary_prompt_tokens``; a summary
  without the three sections is kept as written (``parsed=False``), an empty one is stored but
  never picked, and a summariser error is a warning (the step goes on without new skills).
* Which rollouts: at a task's step, the rollouts of the task that no skill of this run was
  written from yet: its train-split trajectories already in the store (earlier steps,
  ``collect --reference`` rows, other runs) and, with ``skill_source="step"`` (default), this
  step's group; the newest ``summary_rollouts`` of them are shown. A task's bank grows by one
  skill per visit until it holds ``max_skills`` (4); later visits only choose. With
  ``skill_source="store"`` a skill never comes from the rollouts it scores, but a task has no
  skill at its first visit (teacher = plain prompt, distillation term 0; ``no_skill_frac``).
  Why "step" by default: with B.1's thousands of tasks and 8 tasks per step most visits are
  first visits, which would leave Skill-SD as plain GRPO most of the time.
* Selection: one skill per task and step by UCB1, mean reward + c sqrt(ln N / n), c = sqrt 2,
  unseen skills first (the oldest first; ties go to the oldest). Credit (the sources do not
  say; our choice): when the task is played again, the skill of its previous visit is
  credited the new group's mean reward (the reward after training with that skill's teacher;
  a reward of the same step could not depend on the skill, since rollouts come first).
* Storage: the ``skills`` table of the store (:class:`schemas.SkillRecord`, an append-only
  event log tagged with run id and step). A resumed run deletes its rows of steps after the
  checkpoint and rebuilds the bank from the rest; the checkpoint's ``state.json`` holds the
  number of rows, checked on resume.
* Teacher: the current student, synced after every optimizer step (a LoRA adapter
  ``teacher`` on the student's backbone, :func:`~stages.core.models.assembly.copy_adapter_`; a frozen
  copy for full fine-tuning), no gradient. It scores the student's sampled tokens with the
  skill appended to the first user message (B.1's framing in our words: :data:`SKILL_HEAD`,
  the skill, :data:`SKILL_TAIL`).
* Loss: PPO-clip of :mod:`stages.methods.grpo` with eps 0.2/0.28 and std-normalised group
  advantages, plus ``sdl_coef`` (0.001) x :func:`~stages.core.losses.pg.sampled_token_sdl`
  (rho x (e^-l - 1 + l), l = log S - log T at the sampled token; rho unclipped unless
  ``sdl_ratio_clip``); both token-means over the step's action tokens by default.
"""
from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from schemas import Message, SkillRecord, Trajectory
from schemas.arrow import arrow_schema, from_row, schema_diff, to_rows
from stages.core.data.rows import TrainRow
from stages.core.data.store import ExperienceStore, StoreError, sql_str
from stages.core.latent.privileged import privileged_prefix
from stages.core.latent.teacher import context_teacher_logits
from stages.core.losses.pg import sampled_token_sdl
from stages.core.models.assembly import copy_adapter_, ema_update_, frozen_teacher_copy
from stages.methods import StepBatch, StepContext, Student, register
from stages.methods.grpo import GRPO, PGExtra
from stages.methods.options import SkillSDOptions

SKILLS_TABLE = "skills"
TEACHER_ADAPTER = "teacher"
SKILL_HEAD = ("Below is a skill note written from earlier attempts at this task: what worked, what to "
              "avoid and a suggested workflow.")
SKILL_TAIL = "Treat it as a hint only and solve the current task with your own reasoning."
SECTIONS = ("What works", "What to avoid", "Suggested workflow")
_FIELD_CHARS = 400  # cap on one action / observation shown to the summariser
_MAX_SKILL_CHARS = 2000


# ------------------------------------------------------------------------- the skill bank --


def ucb1_pick(counts: list[int], means: list[float], c: float = math.sqrt(2.0)) -> int | None:
    """Index of the arm UCB1 plays: the first unseen arm, else argmax mean + c sqrt(ln N / n).

    Ties go to the lowest index. None when there is no arm.
    """
    if not counts:
        return None
    for i, n in enumerate(counts):
        if n == 0:
            return i
    total = sum(counts)
    scores = [m + c * math.sqrt(math.log(total) / n) for m, n in zip(means, counts)]
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


class SkillBank:
    """One run's skills and UCB1 statistics, backed by the store's ``skills`` table.

    Raises (constructor):
        StoreError: the table exists with another schema than ``arrow_schema(SkillRecord)``.
    """

    def __init__(self, db: Any, run_id: str) -> None:
        expected = arrow_schema(SkillRecord)
        self.run_id = run_id
        try:
            self.table = db.open_table(SKILLS_TABLE)
        except ValueError:  # not there yet
            self.table = db.create_table(SKILLS_TABLE, schema=expected, exist_ok=True)
        diffs = schema_diff(expected, self.table.schema)
        if diffs:
            raise StoreError(f"table '{SKILLS_TABLE}' does not match the SkillRecord schema: {'; '.join(diffs)}")
        self.skills: dict[str, list[SkillRecord]] = {}  # task id -> skills, oldest first
        self.stats: dict[str, list[float]] = {}  # skill id -> [credits, reward sum]
        self.pending: dict[str, str] = {}  # task id -> skill id of its last, not yet credited use
        self.sources: dict[str, set[str]] = {}  # task id -> trajectory ids skills were written from
        self.records = 0

    def _where(self, after_step: int | None = None) -> str:
        where = f"run_id = {sql_str(self.run_id)}"
        return where if after_step is None else f"{where} AND step > {int(after_step)}"

    def drop_after(self, step: int) -> int:
        """Delete this run's rows of steps > ``step``; returns how many."""
        stale = self.table.count_rows(self._where(step))
        if stale:
            self.table.delete(self._where(step))
        return stale

    def load(self) -> None:
        """Rebuild the bank from this run's rows (in the order they were applied: by step, then
        credit, skill, use rows)."""
        rows = self.table.search().where(self._where()).limit(None).to_arrow().to_pylist()
        self.apply(sorted((from_row(SkillRecord, r) for r in rows), key=lambda r: (r.step, r.record_id)))

    def apply(self, records: list[SkillRecord]) -> None:
        """Add ``records`` to the in-memory bank (not to the table)."""
        for r in records:
            self.records += 1
            if r.kind == "skill":
                self.skills.setdefault(r.task_id, []).append(r)
                self.sources.setdefault(r.task_id, set()).update(r.sources)
            elif r.kind == "use":
                self.pending[r.task_id] = r.skill_id
            else:
                self.pending.pop(r.task_id, None)
                stat = self.stats.setdefault(r.skill_id, [0, 0.0])
                stat[0] += 1
                stat[1] += r.reward

    def write(self, records: list[SkillRecord]) -> None:
        """Append ``records`` to the table in one transaction."""
        if records:
            self.table.add(to_rows(records, SkillRecord))

    def pick(self, task_id: str, c: float) -> SkillRecord | None:
        """The task's skill by UCB1 (:func:`ucb1_pick`) among its non-empty skills, or None."""
        usable = [s for s in self.skills.get(task_id, []) if s.text.strip()]
        stats = [self.stats.get(s.record_id, [0, 0.0]) for s in usable]
        i = ucb1_pick([int(n) for n, _ in stats], [total / n if n else 0.0 for n, total in stats], c)
        return None if i is None else usable[i]

    def size(self) -> int:
        return sum(len(v) for v in self.skills.values())


# ------------------------------------------------------------------------ the summariser --


def _clip(text: str, limit: int = _FIELD_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + " ..."


def attempts_text(trajectories: list[Trajectory]) -> str:
    """The rollouts shown to the summariser: per attempt its reward, actions and observations."""
    parts = []
    for i, traj in enumerate(trajectories, 1):
        lines = [f"Attempt {i} (reward {traj.reward:.2f}):"]
        for turn in traj.turns:
            lines.append(f"  Action: {_clip(turn.action)}")
            if turn.observation.strip():
                lines.append(f"  Observation: {_clip(turn.observation)}")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def summary_prompt_ids(tokenizer: Any, task_prompt: str, trajectories: list[Trajectory], max_tokens: int) -> list[int]:
    """Token ids of the summariser's prompt (chat template, answer primed with "What works:").

    The attempts are cut (from the end) so that the whole prompt stays within ``max_tokens``.
    """
    from stages.core.text.chat import render_prompt

    def render(attempts: str) -> list[int]:
        user = (f"Here are an agent's attempts at a task. Write a short, reusable skill note for this task.\n\n"
                f"Task:\n{_clip(task_prompt, 2000)}\n\nAttempts:\n{attempts}\n\n"
                f"Answer with exactly three sections, each a few short lines:\n{SECTIONS[0]}: ...\n"
                f"{SECTIONS[1]}: ...\n{SECTIONS[2]}: ...\nBe concrete (tool names, arguments, order of steps).")
        text = render_prompt(tokenizer, [Message(role="user", content=user)], []) + f"{SECTIONS[0]}:"
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    attempts = attempts_text(trajectories)
    ids = render(attempts)
    if len(ids) > max_tokens:
        attempt_ids = tokenizer(attempts, add_special_tokens=False)["input_ids"]
        keep = max(0, len(attempt_ids) - (len(ids) - max_tokens) - 8)
        ids = render(tokenizer.decode(attempt_ids[:keep]) + " ...")[:max_tokens]
    return ids


def parse_summary(text: str) -> tuple[str, bool]:
    """A summary's skill text and whether it has the three sections (in order, each non-empty).

    Parsed: normalised to ``What works: ...\\nWhat to avoid: ...\\nSuggested workflow: ...``.
    Else the stripped text as written (both capped at 2000 characters).
    """
    heads = [re.search(rf"(?im)^[\s#*_\-]*{re.escape(name)}[\s*_]*:", text) for name in SECTIONS]
    if all(heads) and heads[0].start() < heads[1].start() < heads[2].start():
        ends = [heads[1].start(), heads[2].start(), len(text)]
        bodies = [" ".join(text[h.end():e].replace("*", " ").split()) for h, e in zip(heads, ends)]
        if all(bodies):
            return "\n".join(f"{n}: {b}" for n, b in zip(SECTIONS, bodies))[:_MAX_SKILL_CHARS], True
    return text.strip()[:_MAX_SKILL_CHARS], False


def skill_context(text: str) -> str:
    """What the teacher's first user message gets appended (B.1's framing, in our words)."""
    return f"{SKILL_HEAD}\n\n{text.strip()}\n\n{SKILL_TAIL}"


# ------------------------------------------------------------------------------- the method --


@register("skill-sd")
class SkillSD(GRPO):
    """Skill-SD in the distill loop; see the module docstring."""

    Options = SkillSDOptions
    options: SkillSDOptions
    metrics = GRPO.metrics + ("sdl", "sdl_gap", "no_skill_frac", "skills_written", "bank_size", "skill_credits")
    data_parallel = False  # prepare writes the skills table and generates summaries

    def __init__(self, config: Any, resume_from: Path | None, state: dict) -> None:
        super().__init__(config, resume_from, state)
        self.teacher_model = None if self.student.adapter else frozen_teacher_copy(self.student.model)
        self.sync_teacher()  # the teacher is the current student (restored one on resume)
        self.bank = SkillBank(ExperienceStore.open(config.store, create=False).db, config.run_id)
        self.bank.drop_after(state.get("step", 0))  # rows written after the checkpoint
        self.bank.load()
        if "skill_records" in state and state["skill_records"] != self.bank.records:
            raise ValueError(f"store {config.store}: table '{SKILLS_TABLE}' holds {self.bank.records} rows "
                             f"of run {config.run_id} up to step {state.get('step')}, but the checkpoint "
                             f"recorded {state['skill_records']}")
        self._summarizer: tuple[Any, Any, str] | None = None

    def build_student(self, resume_from: Path | None) -> Student:
        """The student, plus (LoRA) a frozen ``teacher`` adapter of the same rank on its backbone."""
        student = super().build_student(resume_from)
        if student.adapter is not None:
            from stages.core.models.composer import adapter_parameters, add_lora_adapter
            rank = self.config.student_lora_rank
            add_lora_adapter(student.model, TEACHER_ADAPTER, rank, 2 * rank)
            for p in adapter_parameters(student.model, TEACHER_ADAPTER):
                p.requires_grad_(False)
        return student

    @torch.no_grad()
    def sync_teacher(self) -> None:
        """Teacher <- current student (exact copy, no gradient)."""
        if self.teacher_model is None:
            copy_adapter_(self.student.model, self.student.adapter, TEACHER_ADAPTER)
        else:
            ema_update_(self.teacher_model, self.student.model, 1.0)

    def summarizer(self, context: StepContext) -> tuple[Any, Any, str]:
        """(engine, tokenizer, name) that writes skills: the run's engine, or ``summarizer``."""
        if self._summarizer is None:
            name = self.options.summarizer
            if name is None:
                self._summarizer = (context.engine, self.student.tokenizer, f"{self.config.model} (student)")
            else:
                from stages.core.models.backbone import load_policy
                from stages.engines import make_engine
                model, tokenizer = load_policy(name, dtype=self.dtype, device=self.device)
                model.requires_grad_(False)
                self._summarizer = (make_engine("hf", model.eval(), tokenizer, batch_size=self.config.rollout_batch),
                                    tokenizer, name)
        return self._summarizer

    def write_skills(self, groups: dict[str, list[Trajectory]], step: int, context: StepContext) -> list[SkillRecord]:
        """New skills of this step: one per task whose bank holds fewer than ``max_skills`` and
        that has rollouts no skill was written from (the store's earlier train-split rollouts of
        the task and, with ``skill_source="step"``, this step's group)."""
        from stages.engines import SamplingParams

        o, pending = self.options, []
        for task_id, trajs in groups.items():
            if len(self.bank.skills.get(task_id, [])) >= o.max_skills:
                continue
            seen = self.bank.sources.get(task_id, set())
            found = [t for t in context.store.query(task_ids={task_id}, env=trajs[0].env, split="train")
                     if t.turns and t.trajectory_id not in seen]
            found.sort(key=lambda t: (json.loads(t.info or "{}").get("distill_step", 0), t.trajectory_id))
            if o.skill_source == "step":
                found += [t for t in trajs if t.turns and t.trajectory_id not in seen]
            if found:
                pending.append((task_id, trajs[0], found))
        if not pending:
            return []
        engine, tokenizer, name = self.summarizer(context)
        prompts = [summary_prompt_ids(tokenizer, traj.prompt, found[-o.summary_rollouts:], o.summary_prompt_tokens)
                   for _, traj, found in pending]
        try:
            texts = [g.text for g in engine.generate(prompts, SamplingParams(
                temperature=0.0, top_p=1.0, max_new_tokens=o.summary_max_tokens))]
        except Exception as err:  # noqa: BLE001 - a failed summary never stops training
            warnings.warn(f"skill-sd: the summariser failed at step {step} ({type(err).__name__}: {err}); "
                          "no new skills this step", stacklevel=2)
            return []
        records = []
        for i, ((task_id, traj, found), raw) in enumerate(zip(pending, texts)):
            text, parsed = parse_summary(f"{SECTIONS[0]}:{raw}")
            if not parsed and not raw.strip():
                text = ""
            rid = f"{self.config.run_id}-{step:06d}-skill-{i:04d}"
            records.append(SkillRecord(record_id=rid, run_id=self.config.run_id, step=step, kind="skill",
                                       env=traj.env, task_id=task_id, skill_id=rid, text=text, parsed=parsed,
                                       sources=[t.trajectory_id for t in found], summarizer=name))
        return records

    def prepare(self, batch: StepBatch, context: StepContext) -> list[PGExtra]:
        """Advantages (GRPO); credit of each task's last skill use; new skills; one UCB1 skill per
        task; the teacher's prompt per row. The step's skill rows are one table transaction."""
        extras = super().prepare(batch, context)
        step, run_id = context.step, self.config.run_id
        groups: dict[str, list[Trajectory]] = {}
        for t in batch.trajectories:
            groups.setdefault(t.task_id, []).append(t)

        def record(kind: str, i: int, trajs: list[Trajectory], skill_id: str, reward: float = 0.0) -> SkillRecord:
            return SkillRecord(record_id=f"{run_id}-{step:06d}-{kind}-{i:04d}", run_id=run_id, step=step, kind=kind,
                               env=trajs[0].env, task_id=trajs[0].task_id, skill_id=skill_id, reward=reward)

        credits = [record("credit", i, trajs, self.bank.pending[task_id], sum(t.reward for t in trajs) / len(trajs))
                   for i, (task_id, trajs) in enumerate((k, v) for k, v in groups.items() if k in self.bank.pending)]
        self.bank.apply(credits)
        written = self.write_skills(groups, step, context)
        self.bank.apply(written)
        picks = {task_id: self.bank.pick(task_id, self.options.ucb_c) for task_id in groups}
        uses = [record("use", i, groups[task_id], skill.record_id)
                for i, (task_id, skill) in enumerate((k, v) for k, v in picks.items() if v is not None)]
        self.bank.apply(uses)
        self.bank.write(credits + written + uses)  # dropped on resume when past the checkpoint
        tokenizer = self.student.tokenizer
        for row, extra in zip(batch.rows, extras):
            skill = picks[row.trajectory.task_id]
            if skill is not None:
                extra.prefix_ids = privileged_prefix(tokenizer, row, user=skill_context(skill.text))
                extra.skill_id = skill.record_id
        self.step_metrics.update({
            "no_skill_frac": sum(e.skill_id == "" for e in extras) / max(len(extras), 1),
            "skills_written": float(len(written)), "bank_size": float(self.bank.size()),
            "skill_credits": float(len(credits))})
        return extras

    def extra_terms(self, rows: list[TrainRow], extras: list[PGExtra], ids: torch.Tensor, attn: torch.Tensor,
                    insert_at: torch.Tensor, mask: torch.Tensor, logp: torch.Tensor, old: torch.Tensor,
                    denom: float) -> tuple[torch.Tensor | None, dict[str, float]]:
        """sdl_coef x the sampled-token distillation term against the skill-reading teacher."""
        o = self.options
        if o.sdl_coef == 0:
            return None, {}
        prefixes = [e.prefix_ids if e.prefix_ids is not None else ids[b, :int(insert_at[b])].tolist()
                    for b, e in enumerate(extras)]
        model, adapter = ((self.student.model, TEACHER_ADAPTER) if self.teacher_model is None
                          else (self.teacher_model, None))
        with torch.no_grad():
            t_logp = self.sampled_logprobs(model, lambda hidden: context_teacher_logits(
                model, ids, attn, insert_at, prefixes, adapter=adapter, hidden=hidden), ids, mask)
        sdl, m = sampled_token_sdl(logp, t_logp, old, mask, ratio_clip=o.sdl_ratio_clip,
                                   aggregation=o.aggregation, denominator=denom)
        share = float(mask.sum()) / max(self.step_tokens, 1)
        return o.sdl_coef * sdl, {"sdl": m["sdl"], "sdl_gap": share * m["sdl_gap"]}

    def after_step(self, sums: dict[str, float]) -> dict[str, float]:
        """Sync the teacher to the updated student; the step's counts."""
        self.sync_teacher()
        return super().after_step(sums)

    def state(self) -> dict[str, Any]:
        return {"skill_records": self.bank.records}
