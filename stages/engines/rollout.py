"""Multi-turn rollouts: a policy engine plays many environment episodes at once.

Used by `collect`, `distill` (on-policy rollouts) and `evaluate`. Episodes advance in lock step:
one batched ``generate`` produces one action for each live episode, and each environment answers
its own action. Finished episodes leave the batch and queued ones take their place.

Token transcript: each episode keeps the token ids its policy is conditioned on. The first
prompt is the chat-template rendering of the opening messages; after each action the SAMPLED ids
are appended as they are (never re-tokenized from text), then the tokens of what follows them
(:func:`stages.core.text.chat.context_after_action`: end-of-turn marker unless sampled, observation,
next assistant header). Each :class:`Turn` records its context ids, sampled ids, sampling
log-probs and finish reason, so training sees exactly what the policy saw and sampled. When the
environment changes the tool list, the prompt is rebuilt from scratch (``context_restart``).

Context window: an episode whose next prompt plus ``max_new_tokens`` would not fit the engine's
``context_window`` (the model's ``max_position_embeddings``) ends before that call, scored 0
with ``info["stopped"] = "context window"``; a one-line warning names the task, the token count,
the limit and the flags that shorten an episode, and :attr:`RolloutStats.context_overflows`
counts it. The run goes on (a model with learned positions would fail past its window).
"""
from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from schemas import Message, Task, Trajectory, Turn
from stages.core.text.chat import context_after_action, render_prompt, tokenizer_fingerprint
from stages.engines import Generation, RolloutEngine, SamplingParams, row_seed
from stages.envs import Environment


@dataclass
class _Episode:
    task: Task
    position: int  # the task's position in the run's task list (row seeds)
    sample: int
    env: Environment
    messages: list[Message]
    tools: list[dict]
    reference: list[str] | None = None
    turns: list[Turn] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)  # the token transcript (the next prompt)
    context: list[int] = field(default_factory=list)  # ids appended since the last action
    restart: bool = False


@dataclass
class RolloutStats:
    """Running totals over all episodes played so far (tokens are generated tokens)."""

    episodes: int = 0
    actions: int = 0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    env_seconds: float = 0.0
    context_overflows: int = 0  # episodes ended because the next prompt would overflow the context window


OVERFLOW_WARNINGS = 5  # context-window warnings per RolloutStats; later overflows are only counted


def play(
    engine: RolloutEngine | None,
    tokenizer,
    make_env: Callable[[], Environment],
    tasks: Iterable[Task],
    *,
    samples_per_task: int,
    params: SamplingParams,
    policy_id: str,
    run_id: str,
    git_commit: str = "",
    max_concurrent: int = 8,
    stats: RolloutStats | None = None,
    reference: bool = False,
    on_step: Callable[[RolloutStats], None] | None = None,
    task_offset: int = 0,
    context_window: int | None = None,
) -> Iterator[Trajectory]:
    """Roll out ``samples_per_task`` episodes per task; yield each Trajectory as it finishes.

    Args:
        engine: batched text generator (see :class:`stages.core.models.backbone.RolloutEngine`). One with
            a ``begin_episode(task, messages, tools, prompt_ids)`` method is told of every
            episode before its first prompt (:class:`stages.engines.latent.LatentEngine`).
        tokenizer: the policy's tokenizer, used to render conversations with its chat template.
        make_env: builds a fresh environment; called once per episode (no state is shared).
        tasks: tasks to play, in order.
        samples_per_task: G, independent episodes per task.
        params: sampling parameters; with ``params.seed`` set, turn t of sample g of the task at
            position p (``task_offset`` + its index in ``tasks``) is sampled under the row seed
            :func:`stages.engines.row_seed` ``(seed, p, g, t)``: the rollouts depend on neither
            ``max_concurrent``, nor the engine's batching, nor how a run's tasks are split
            between calls or processes (up to the float noise of batched logits).
        policy_id, run_id, git_commit: provenance written into every trajectory.
        max_concurrent: episodes advanced together in one batched generate call.
        stats: optional totals to update in place (tokens, seconds).
        reference: play each task's reference solution (``env.reference_actions(task)``) instead
            of generating; ``engine`` is then unused. The actions still go through the real
            environment and checker, so the reward is verified, not assumed.
        on_step: called with ``stats`` after every batched generate call (e.g. to refresh a
            progress bar while long episodes are still running).
        task_offset: position of ``tasks``' first task in the run's whole task list (a
            data-parallel rank's share starts there), so row seeds are those of the whole list.
        context_window: the most tokens a prompt plus its ``max_new_tokens`` may take (None: the
            engine's ``context_window``, else no limit; reference replays have none): an episode
            that would exceed it ends, scored 0 (module docstring).

    Yields:
        Trajectory rows with the environment's verified reward. Environment failures inside an
        episode end that episode with reward 0 and the reason in ``info``; they never stop the run.
        ``trajectory_id`` is derived from (``run_id``, task id, sample index), so a run's ids are
        unique and the same every time it is played.
    """
    stats = stats if stats is not None else RolloutStats()
    if context_window is None and not reference:
        context_window = getattr(engine, "context_window", None)
    queue = [(t, task_offset + i, g) for i, t in enumerate(tasks) for g in range(samples_per_task)]
    queue.reverse()
    live: list[_Episode] = []
    while queue or live:
        while queue and len(live) < max_concurrent:
            task, position, sample = queue.pop()
            env = make_env()
            try:
                opening = env.reset(task)
                refs = env.reference_actions(task) if reference else None
            except Exception as err:  # an environment that cannot start fails its episode only
                env.close()
                yield _failed(task, sample, policy_id, run_id, git_commit, f"reset failed: {err}")
                continue
            ep = _Episode(task, position, sample, env, list(opening), task.tool_schemas, refs)
            ep.ids = ep.context = _encode(tokenizer, render_prompt(tokenizer, ep.messages, ep.tools))
            if hasattr(engine, "begin_episode"):  # e.g. a latent-conditioned engine: per-task latents
                try:
                    engine.begin_episode(task, ep.messages, ep.tools, ep.ids)
                except Exception as err:
                    env.close()
                    yield _failed(task, sample, policy_id, run_id, git_commit, f"engine could not start: {err}")
                    continue
            live.append(ep)
        if context_window is not None:
            fits = []
            for ep in live:
                if len(ep.ids) + params.max_new_tokens <= context_window:
                    fits.append(ep)
                else:
                    yield _overflowed(ep, context_window, params.max_new_tokens, stats, policy_id, run_id,
                                      git_commit, tokenizer_fingerprint(tokenizer))
            live = fits
        if not live:
            continue
        t0 = time.perf_counter()
        if reference:
            generations = [_reference_generation(ep, tokenizer) for ep in live]
        else:
            seeds = None if params.seed is None else [row_seed(params.seed, ep.position, ep.sample, len(ep.turns))
                                                      for ep in live]
            generations = engine.generate([ep.ids for ep in live], params.model_copy(update={"seeds": seeds}))
        stats.generate_seconds += time.perf_counter() - t0
        stats.actions += len(generations)
        if on_step is not None:
            on_step(stats)
        still_live: list[_Episode] = []
        for ep, gen in zip(live, generations):
            stats.generated_tokens += gen.num_tokens
            t0 = time.perf_counter()
            try:
                result = ep.env.step(gen.text)
            except Exception as err:
                result = None
                ep.info = {"error": f"environment step failed: {err}"}
            stats.env_seconds += time.perf_counter() - t0
            calls = result.tool_calls if result else []
            ep.messages.append(Message(role="assistant", content=gen.text, tool_calls=calls))
            obs = result.observation if result else []
            ep.messages.extend(obs)
            ep.turns.append(
                Turn(
                    action=gen.text,
                    tool_calls=calls,
                    observation="\n".join(m.content for m in obs),
                    action_tokens=gen.num_tokens,
                    token_ids=gen.token_ids,
                    logprobs=gen.logprobs,
                    finish_reason=gen.finish_reason,
                    context_ids=ep.context,
                    context_restart=ep.restart,
                )
            )
            if result is not None and "tools" in result.info:
                ep.tools = result.info.pop("tools")
                ep.restart = True
            else:
                ep.restart = False
            if result is not None and not result.done and len(ep.turns) < ep.env.max_turns:
                _advance(ep, gen, tokenizer)
                still_live.append(ep)
                continue
            reward = result.reward if result is not None and result.done else 0.0
            if result is not None:
                ep.info = {**result.info, **({} if result.done else {"stopped": "step cap reached"})}
            ep.env.close()
            stats.episodes += 1
            yield _trajectory(ep, reward, policy_id, run_id, git_commit, tokenizer_fingerprint(tokenizer))
        live = still_live


def _encode(tokenizer, text: str) -> list[int]:
    # verbose=False: no tokenizer warning about the model's maximum length (play checks the window)
    return tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]


def _overflowed(ep: _Episode, window: int, max_new_tokens: int, stats: RolloutStats, policy_id: str, run_id: str,
                git_commit: str, tokenizer: str) -> Trajectory:
    """End episode ``ep``, whose next prompt plus ``max_new_tokens`` exceeds ``window``: scored 0,
    counted in ``stats``, warned about (the first :data:`OVERFLOW_WARNINGS` per ``stats``)."""
    stats.context_overflows += 1
    stats.episodes += 1
    if stats.context_overflows <= OVERFLOW_WARNINGS:
        more = " (further overflows are only counted)" if stats.context_overflows == OVERFLOW_WARNINGS else ""
        if ep.turns:  # the episode's context outgrew the window
            fix = "lower --max-new-tokens or --max-turns, or a --model with a longer context"
        elif len(ep.ids) >= window:
            fix = "the prompt alone fills it: a --model with a longer context"
        else:
            fix = "lower --max-new-tokens, or a --model with a longer context"
        warnings.warn(f"task {ep.task.task_id} (sample {ep.sample}): the prompt of turn {len(ep.turns) + 1} is "
                      f"{len(ep.ids)} tokens, with --max-new-tokens {max_new_tokens} over the model's context window "
                      f"of {window}: episode ended, scored 0 ({fix}){more}", RuntimeWarning, stacklevel=3)
    ep.info = {**ep.info, "stopped": "context window", "success": False, "context_tokens": len(ep.ids),
               "context_window": window}
    ep.env.close()
    return _trajectory(ep, 0.0, policy_id, run_id, git_commit, tokenizer)


def _advance(ep: _Episode, gen: Generation, tokenizer) -> None:
    """Extend ``ep``'s transcript past ``gen`` and the environment's answer (the next prompt)."""
    if ep.restart:  # new tool list: the whole prompt is rendered again
        ep.context = _encode(tokenizer, render_prompt(tokenizer, ep.messages, ep.tools))
        ep.ids = ep.context
        return
    end = tokenizer.decode(gen.token_ids[-1:]) if gen.finish_reason == "eos" else ""
    ep.context = _encode(tokenizer, context_after_action(tokenizer, ep.messages, ep.tools, sampled_end=end))
    ep.ids = [*ep.ids, *gen.token_ids, *ep.context]


def _reference_generation(ep: _Episode, tokenizer) -> Generation:
    """The next reference action of ``ep`` (an empty answer once the reference is used up).

    Its ids are the tokenization of the reference text plus the eos id (the policy's way of
    ending a turn); it has no sampling log-probs.
    """
    refs = ep.reference or []
    text = refs[len(ep.turns)] if len(ep.turns) < len(refs) else ""
    ids = [*_encode(tokenizer, text), *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])]
    return Generation(text=text, token_ids=ids, logprobs=[], num_tokens=0, finish_reason="eos")


def _trajectory(ep: _Episode, reward: float, policy_id: str, run_id: str, git_commit: str,
                tokenizer: str = "") -> Trajectory:
    reward = min(1.0, max(0.0, float(reward)))
    return Trajectory(
        # a function of (run, task, sample): a re-run orders and retrieves its rows the same way
        trajectory_id=hashlib.sha1(f"{run_id}\0{ep.task.task_id}\0{ep.sample}".encode()).hexdigest()[:32],
        task_id=ep.task.task_id,
        env=ep.task.env,
        split=ep.task.split,
        prompt=ep.task.prompt,
        policy=policy_id,
        messages=ep.messages,
        turns=ep.turns,
        reward=reward,
        success=bool(ep.info.get("success", reward >= 1.0)),
        num_steps=len(ep.turns),
        num_tool_calls=sum(len(t.tool_calls) for t in ep.turns),
        run_id=run_id,
        git_commit=git_commit,
        # the tool schemas offered at the end, so training can re-render exactly this prompt
        info=json.dumps({**ep.info, "tools": ep.tools}, default=str),
        tokenizer=tokenizer,
    )


def _failed(task: Task, sample: int, policy_id: str, run_id: str, git_commit: str, reason: str) -> Trajectory:
    ep = _Episode(task, 0, sample, None, [Message(role="user", content=task.prompt)], [])  # type: ignore[arg-type]
    ep.info = {"error": reason, "success": False}
    return _trajectory(ep, 0.0, policy_id, run_id, git_commit)
