"""EnvScaler's episode rules: how one agent reply becomes one action, and how an episode ends.

Three rule sets, chosen per environment with ``episode_rules`` (``exact`` only where tasks carry
reference actions: the lopd study bed):

- ``official``: EnvScaler's own non-conversational evaluation (RUC-NLPIR/EnvScaler at 87e6673,
  prompt mode): the text after the last ``</think>`` is the reply; an empty reply ends the episode
  with reward 0; only the first ``<tool_call>`` of a reply runs; a reply with text and no tool call
  ends the episode and is scored; a tool that raises ends the episode with reward 0; reaching the
  step cap without a final reply scores 0; the reward is the share of checks passed rounded to 4
  decimals. Malformed replies and invalid actions are observations (the episode goes on).
- ``lenient``: lopd's training rules: every tool call of a reply runs, a raising tool is an
  observation, the step cap and an empty reply score the final state.
- ``exact``: the lenient play, scored against the state the task's reference actions produce
  (:func:`exact_reward`): success only when the final state equals it on every field of every
  object; reward 0 when anything outside the reference's changes changed or a call was refused
  (the environment turned it down, or a tool that is not a lookup changed nothing: see
  :func:`is_lookup`); otherwise the share of checks passed, below 1 while the state differs.

:func:`official_action` reads one reply the official way; :class:`stages.envs.envscaler.EnvScalerEnv`
plays the rest.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

EPISODE_RULES = ("official", "lenient", "exact")
EpisodeRules = Literal["official", "lenient", "exact"]
CHAT_ACTION = "chat_with_user"  # the action a reply without a tool call becomes

# Observation texts of the official environment, word for word.
PARSE_RESPONSE_ERROR = "Error: Failed to parse response to struct response"
PARSE_ACTION_ERROR = "Error: Failed to parse response to action"
INVALID_ACTION = "Error: Invalid action"

LOOKUP_PREFIXES = ("get_", "list_", "find_", "search_", "lookup_", "view_")

_THINK = re.compile(r"(?:<|@)think(?:>|@)\s*(.*?)(?:<|@)/think(?:>|@)", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"(?:<|@)think(?:>|@)", re.IGNORECASE)
_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def check_rules(rules: str, where: str, allowed: tuple[str, ...] = EPISODE_RULES) -> str:
    """``rules`` if it names one of the ``allowed`` rule sets.

    Raises:
        ValueError: any other name (the message names ``where`` and the choices).
    """
    if rules not in allowed:
        raise ValueError(f"{where}: episode_rules must be one of {', '.join(allowed)}, got {rules!r}")
    return rules


def is_lookup(tool_name: str) -> bool:
    """Whether a tool only reads, by the lopd study bed's naming convention (``find_``, ``get_``,
    ``list_``, ``search_``, ``lookup_``, ``view_``). Under the ``exact`` rules a call of any other
    tool that changes nothing (a repeat, a value set to what it was) counts as refused."""
    return tool_name.startswith(LOOKUP_PREFIXES)


@dataclass(frozen=True)
class OfficialAction:
    """One reply read by the official rules.

    Attributes:
        kind: ``"empty"`` (nothing after the think block: the episode ends with reward 0),
            ``"error"`` (``error`` is the observation; the episode goes on), ``"chat"`` (a final
            reply: the episode ends and is scored) or ``"call"`` (run ``name(**arguments)``).
        name, arguments: the action (``arguments`` is whatever the reply's JSON held; the caller
            checks that it is an object).
        error: the observation text of an ``"error"``.
    """

    kind: Literal["empty", "error", "chat", "call"]
    name: Any = None
    arguments: Any = field(default_factory=dict)
    error: str = ""


def official_action(reply: str) -> OfficialAction:
    """Read one agent reply as EnvScaler's evaluation does (prompt mode).

    Transcribes ``interact_with_env/agent/task_solve_agent.py`` (``step``: keep the text after the
    last ``</think>``; an empty reply ends the episode), ``interact_with_env/envscaler_env/utils/
    parse_util.py`` (``parse_response``, ``parse_action``) and the action checks of
    ``interact_with_env/envscaler_env/base_env.py`` (``step``: a parse failure is an observation;
    a ``chat_with_user`` action needs a ``content`` argument).

    Args:
        reply: the model's raw reply text.

    Returns:
        The action (see :class:`OfficialAction`). Never raises: the reply is untrusted text.
    """
    text = reply.split("</think>")[-1].strip() if "</think>" in reply else reply
    if text == "":
        return OfficialAction("empty")
    text = text.strip()
    think = _THINK.search(text)
    if not think and _THINK_OPEN.search(text):
        return OfficialAction("error", error=PARSE_RESPONSE_ERROR)
    calls = list(_TOOL_CALL.finditer(text))
    if not calls and "<tool_call>" in text and "</tool_call>" not in text:
        return OfficialAction("error", error=PARSE_RESPONSE_ERROR)
    first = calls[0] if calls else None
    if think and first:
        content = text[think.end():first.start()].strip()
    elif think:
        content = text[think.end():].strip()
    elif first:
        content = text[:first.start()].strip()
    else:
        content = text.strip()
    if first is None:
        if not content:
            return OfficialAction("error", error=PARSE_ACTION_ERROR)
        return _checked(CHAT_ACTION, {"content": content})
    try:
        call = json.loads(first.group(1))
    except (json.JSONDecodeError, RecursionError):
        return OfficialAction("error", error=PARSE_RESPONSE_ERROR)
    if not isinstance(call, dict) or "name" not in call or "arguments" not in call:
        return OfficialAction("error", error=PARSE_RESPONSE_ERROR)
    arguments = call["arguments"]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return OfficialAction("error", error=PARSE_ACTION_ERROR)
    return _checked(call["name"], arguments)


def _checked(name: Any, arguments: Any) -> OfficialAction:
    """The checks of ``check_vaild_action`` that need no environment instance."""
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return OfficialAction("error", error=INVALID_ACTION)
    if name == CHAT_ACTION:
        if "content" not in arguments:
            return OfficialAction("error", error=INVALID_ACTION)
        return OfficialAction("chat", name, arguments)
    return OfficialAction("call", name, arguments)


def official_reward(passed: int, total: int) -> float:
    """Share of checks passed, rounded to 4 decimals (``calculate_reward`` in
    ``interact_with_env/envscaler_env/base_env.py``). ``total`` must be positive."""
    return round(passed / total, 4)


def exact_reward(passed: int, total: int, equal: bool, outside: int, refused: int) -> float:
    """The ``exact`` rules' reward of an episode.

    Args:
        passed, total: checks passed and checks of the task (``total`` positive).
        equal: the final state equals the reference actions' final state.
        outside: differences from the reference state outside the paths the reference changed.
        refused: tool calls the environment refused (raised, returned ``success: False``, an
            unknown tool, arguments that are not an object) and calls of tools that are not
            lookups that changed nothing; each is an attempt the task did not ask for.

    Returns:
        1.0 when ``equal``, every check passed and nothing was refused; 0.0 when ``outside`` or
        ``refused``; else ``passed / total`` capped at ``(total - 1) / total`` (a differing state
        never scores 1). With sound reference actions ``equal`` implies every check passed; a
        reference that fails its own checks thus scores below 1 (``check.py`` reports it).
    """
    if outside or refused:
        return 0.0
    if equal and passed == total:
        return 1.0
    return min(passed, total - 1) / total
