"""Coldstart's data (`lopd coldstart`, :mod:`stages.coldstart.recipe`): targets, the task split, retrieval.

Targets are the store's successful train-split trajectories (optionally of one env) whose
prompt leaves room for an action within ``max_len``. Tasks are split deterministically (seeded
hash of the task id) into train and held-out tasks (:func:`split_tasks`). Retrieval for a
training target never returns the target itself, never a held-out task's trajectory and, with
``exclude_same_task``, no trajectory of the target's own task (with ``self_retrieval`` the
target itself is put first among its experiences); held-out targets retrieve from the whole
store (:class:`ColdstartData`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schemas import Trajectory
from stages.core.data.store import ExperienceStore, StoreError
from stages.core.latent.contexts import LatentBatch, build_batch, retrieve_experiences
from stages.core.latent.placements import get_placement
from stages.core.text.chat import action_spans, tokenize_for_training
from stages.envs import lookup_tools

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from stages.coldstart.settings import ColdstartConfig
    from stages.core.data.retrieval import Retriever


def split_tasks(task_ids: set[str], heldout_fraction: float, seed: int) -> tuple[set[str], set[str]]:
    """Deterministic (train, held-out) task split: tasks ordered by sha1(seed:task_id).

    The first ``round(fraction * n)`` tasks are held out, at least one and at most n - 1 when
    ``fraction > 0`` and there are 2+ tasks; none with a single task or ``fraction == 0``.
    """
    order = sorted(task_ids, key=lambda t: hashlib.sha1(f"{seed}:{t}".encode()).hexdigest())
    n = len(order)
    k = 0
    if heldout_fraction > 0 and n >= 2:
        k = min(max(1, round(heldout_fraction * n)), n - 1)
    return set(order[k:]), set(order[:k])


class ColdstartData:
    """Cached retrievals and tool schemas of coldstart targets, and their batches.

    Args:
        retriever: :class:`stages.core.data.retrieval.Retriever` over the experience store.
        tokenizer: the backbone's tokenizer.
        config: the run's :class:`stages.coldstart.settings.ColdstartConfig` (J, token caps,
            ``exclude_same_task``, ``placement``).
        heldout_tasks: task ids whose trajectories never serve as training experiences.
    """

    def __init__(self, retriever: Retriever, tokenizer: PreTrainedTokenizerBase, config: ColdstartConfig,
                 heldout_tasks: set[str]):
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.config = config
        self.heldout_tasks = heldout_tasks
        self._exps: dict[tuple[str, bool], list[Trajectory]] = {}
        self._tools: dict[str, list[dict]] = {}

    def experiences(self, trajs: list[Trajectory], heldout: bool) -> list[list[Trajectory]]:
        """Per target, its retrieved experiences (cached per target and purpose)."""
        todo = [t for t in trajs if (t.trajectory_id, heldout) not in self._exps]
        if todo:
            # training: held-out tasks never enter the pool; evaluation: the whole store
            found = retrieve_experiences(
                self.retriever, todo, self.config.J, exclude_same_task=self.config.exclude_same_task,
                exclude_task_ids=() if heldout else self.heldout_tasks,
            )
            for t, exps in zip(todo, found):
                self._exps[(t.trajectory_id, heldout)] = exps
        found = [self._exps[(t.trajectory_id, heldout)] for t in trajs]
        if self.config.self_retrieval and not heldout:  # the target itself first (allow_self_retrieval)
            return [[t, *exps[: self.config.J - 1]] for t, exps in zip(trajs, found)]
        return found

    def tools(self, trajs: list[Trajectory]) -> list[list[dict]]:
        """Per target, the tool schemas of its prompt (cached)."""
        todo = [t for t in trajs if t.trajectory_id not in self._tools]
        for t, tools in zip(todo, lookup_tools(todo)):
            self._tools[t.trajectory_id] = tools
        return [self._tools[t.trajectory_id] for t in trajs]

    def batch(self, trajs: list[Trajectory], heldout: bool, device: str, blank: bool = False) -> LatentBatch:
        """The :class:`stages.core.latent.contexts.LatentBatch` of ``trajs`` on ``device``; with ``blank``
        nothing is retrieved and each of a target's J composer input rows is its task text alone
        ("Current task: <x>", :func:`stages.core.latent.contexts.encode_experiences` without experiences)."""
        exps = [[] for _ in trajs] if blank else self.experiences(trajs, heldout)
        return build_batch(
            self.tokenizer, trajs, exps, J=self.config.J,
            max_exp_tokens=self.config.max_exp_tokens, max_len=self.config.max_len,
            tools=self.tools(trajs), framed=get_placement(self.config.placement).needs_frame_ids,
        ).to(device)


def prompt_fits(tokenizer, traj: Trajectory, tools: list[dict], max_len: int) -> bool:
    """Whether at least one action token of ``traj`` lies within the first ``max_len`` tokens."""
    ids, mask = tokenize_for_training(tokenizer, traj.messages, tools)
    spans = action_spans(mask)
    return bool(spans) and spans[0][0] < max_len


@dataclass
class Targets:
    """Coldstart's targets, split by task.

    Attributes:
        train, heldout: the training / held-out targets (store order: by trajectory id).
        train_tasks, heldout_tasks: their task ids.
        too_long: successful trajectories left out because their prompt fills ``max_len``.
    """

    train: list[Trajectory]
    heldout: list[Trajectory]
    train_tasks: set[str]
    heldout_tasks: set[str]
    too_long: int


def successful_trajectories(store: ExperienceStore, config: ColdstartConfig) -> list[Trajectory]:
    """The store's successful train-split trajectories (of ``config.env``), by trajectory id.

    Raises:
        StoreError: fewer than 2 (one target and one experience are needed).
    """
    successes = store.query(success=True, split="train", env=config.env)
    successes.sort(key=lambda t: t.trajectory_id)
    if len(successes) < 2:
        where = f" of env {config.env!r}" if config.env else ""
        raise StoreError(
            f"store {config.experiences} holds {len(successes)} successful train trajectories{where}; "
            "coldstart needs at least 2 (one target and one experience): collect more first")
    return successes


def split_targets(tokenizer: PreTrainedTokenizerBase, successes: list[Trajectory],
                  config: ColdstartConfig) -> Targets:
    """Leave out targets whose prompt alone fills ``max_len`` (they cannot be scored; they are no
    experiences either) and split the rest by task (:func:`split_tasks`).

    The caller checks that at least 2 targets fit (``too_long`` says how many do not).
    """
    fits = [t for t, tools in zip(successes, lookup_tools(successes))
            if prompt_fits(tokenizer, t, tools, config.max_len)]
    train_tasks, heldout_tasks = split_tasks({t.task_id for t in fits}, config.heldout_fraction, config.seed)
    return Targets(train=[t for t in fits if t.task_id in train_tasks],
                   heldout=[t for t in fits if t.task_id in heldout_tasks],
                   train_tasks=train_tasks, heldout_tasks=heldout_tasks, too_long=len(successes) - len(fits))
