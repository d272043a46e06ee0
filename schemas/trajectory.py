"""Tasks, messages, tool calls, turns and trajectories: the rows of the experience store.

All models are frozen and reject unknown fields. Free-form structures (tool schemas, tool-call
arguments, task metadata) are kept as JSON strings so that every field maps onto a fixed Arrow
type (see :mod:`schemas.arrow`).
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["system", "user", "assistant", "tool"]
# train / test, and the study bed's own: warmup (supervised warm start only), test_values (held-out
# values in train phrasings; its test holds out phrasings) and transfer (held-out environments)
Split = Literal["train", "test", "warmup", "test_values", "transfer"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _check_json(value: str, what: str) -> str:
    try:
        json.loads(value)
    except json.JSONDecodeError as err:
        raise ValueError(f"{what} is not valid JSON: {err.msg}") from None
    return value


class ToolCall(_Frozen):
    """One function call parsed from a model action.

    ``arguments`` is a JSON object encoded as a string (e.g. ``'{"city": "Paris"}'``).
    """

    name: str
    arguments: str = "{}"

    @field_validator("arguments")
    @classmethod
    def _arguments_json(cls, v: str) -> str:
        return _check_json(v, "arguments")

    @property
    def args(self) -> dict[str, Any]:
        """The decoded arguments dict."""
        return json.loads(self.arguments)


class Message(_Frozen):
    """One chat message. ``name`` is the tool name on ``role="tool"`` messages."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    name: str | None = None


class Task(_Frozen):
    """A task an environment can be reset to.

    Attributes:
        task_id: unique within ``env``.
        env: registry name of the environment (``bfcl``, ``code``, ``envscaler`` ...).
        split: ``train`` or ``test`` (``warmup``, ``transfer``: see :data:`Split`).
        prompt: the task text shown to the agent (also the retrieval key).
        tools: JSON list of OpenAI-style function schemas offered to the model ("[]" if none).
        metadata: JSON object with whatever the environment needs to run and score the task.
    """

    task_id: str
    env: str
    split: Split
    prompt: str
    tools: str = "[]"
    metadata: str = "{}"

    @field_validator("tools", "metadata")
    @classmethod
    def _json_fields(cls, v: str) -> str:
        return _check_json(v, "field")

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The decoded list of tool schemas."""
        return json.loads(self.tools)

    @property
    def meta(self) -> dict[str, Any]:
        """The decoded metadata dict."""
        return json.loads(self.metadata)


FinishReason = Literal["", "eos", "stop", "length"]


class Turn(_Frozen):
    """One agent action and the environment's answer to it.

    The token fields make on-policy training exact: the training sequence of a trajectory is
    ``context_ids[0] + token_ids[0] + context_ids[1] + token_ids[1] + ...`` (a turn with
    ``context_restart`` starts a new sequence), i.e. exactly the ids the policy was conditioned
    on and sampled, never a re-tokenization of the text. Rows written before these fields
    existed have them empty (training then re-tokenizes the text, with a warning).

    Attributes:
        action: the text the policy generated at this turn (cut before a stop string).
        tool_calls: calls parsed from ``action`` (empty when none or unparsable).
        observation: the environment's reply rendered as text ("" when the episode ended).
        action_tokens: number of tokens the policy generated (0 for replayed reference actions).
        token_ids: the sampled token ids of the action (eos id included when sampled).
        logprobs: per sampled token, its log-prob (nats) under the sampling distribution
            (``log_softmax(logits / temperature)``); [] when not recorded.
        finish_reason: why generation stopped: "eos", "stop" (a stop string), "length"
            (``max_new_tokens``); "" when unknown (older rows).
        context_ids: the prompt tokens fed between the previous action's ``token_ids`` and this
            action (the whole prompt on the first turn or after a context restart).
        context_restart: True when the prompt was rebuilt from scratch before this action
            (e.g. the environment changed the tool list); ``context_ids`` is then the whole prompt.
    """

    action: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    observation: str = ""
    action_tokens: int = Field(default=0, ge=0)
    token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    finish_reason: FinishReason = ""
    context_ids: list[int] = Field(default_factory=list)
    context_restart: bool = False

    @model_validator(mode="after")
    def _aligned(self) -> "Turn":
        if self.logprobs and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"logprobs has {len(self.logprobs)} entries for {len(self.token_ids)} token ids")
        return self

    @property
    def has_tokens(self) -> bool:
        """Whether the sampled ids and their context were recorded (rows of this release)."""
        return bool(self.token_ids) and bool(self.context_ids)


class Trajectory(_Frozen):
    """One multi-turn rollout of a policy on a task, with its verified reward.

    Attributes:
        trajectory_id: globally unique id (uuid4 hex).
        task_id, env, split: identify the task (see :class:`Task`).
        prompt: the task text (copied from the task; the retrieval key).
        policy: model id or path of the policy that produced the actions.
        messages: the whole conversation, system prompt to last observation.
        turns: one entry per agent action.
        reward: verified reward in [0, 1].
        success: whether the task counts as solved.
        num_steps: number of agent actions (== len(turns)).
        num_tool_calls: total tool calls over all turns.
        run_id, git_commit, created_at: provenance.
        info: JSON object with environment-specific scoring details.
        tokenizer: fingerprint of the tokenizer whose ids the turns hold
            (:func:`stages.core.text.chat.tokenizer_fingerprint`); "" when they hold none. Training
            with another tokenizer re-tokenizes the text instead of using the ids.
    """

    trajectory_id: str
    task_id: str
    env: str
    split: Split
    prompt: str
    policy: str
    messages: list[Message]
    turns: list[Turn]
    reward: float = Field(ge=0.0, le=1.0)
    success: bool
    num_steps: int = Field(ge=0)
    num_tool_calls: int = Field(ge=0)
    run_id: str
    git_commit: str = ""
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    info: str = "{}"
    tokenizer: str = ""

    @field_validator("info")
    @classmethod
    def _info_json(cls, v: str) -> str:
        return _check_json(v, "info")

    def render(self) -> str:
        """A human-readable transcript of the trajectory."""
        lines = [f"# {self.env}/{self.task_id} reward={self.reward:.3f} success={self.success}"]
        for m in self.messages:
            body = m.content
            if m.tool_calls:
                body += "".join(f"\n  -> {c.name}({c.arguments})" for c in m.tool_calls)
            lines.append(f"[{m.role}{'/' + m.name if m.name else ''}] {body}")
        return "\n".join(lines)


class RunManifest(_Frozen):
    """What a stage run was asked to do and where it came from; saved as JSON in the run dir."""

    run_id: str
    stage: Literal["collect", "index", "coldstart", "distill", "evaluate", "sft"]
    config: str = "{}"
    lopd_version: str
    git_commit: str = ""
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    data: str = ""  # the data the run read (file, folder or hub id; bundled fixtures say so)
    resumes: list[str] = []  # each later start of the same run (--resume): "<ISO time> <git commit>"

    @field_validator("config")
    @classmethod
    def _config_json(cls, v: str) -> str:
        return _check_json(v, "config")
