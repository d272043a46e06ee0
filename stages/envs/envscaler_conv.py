"""EnvScaler's conversational episodes: a simulated user holds the task, the agent talks to it.

A task row carrying ``user_system_prompt`` is conversational (:mod:`.envscaler_data`); with the
environment option ``conversation=True`` every task is, its user prompted with :data:`USER_PROMPT`
(EnvScaler picks the mode by environment, not by row: ``envscaler_conversation_rl`` plays the same
task rows as the non-conversational environment, its user prompted with the template
``user_system_prompt`` of ``interact_with_env/envscaler_env/utils/user_agent.py`` filled with the
row's ``task``; :data:`USER_PROMPT` states that template's rules in our words). It is played
only when the environment has a ``user_model`` (:class:`stages.envs.envscaler.EnvScalerEnv`
leaves such tasks out of its task lists without one, and refuses to reset one). The rules, read
from RUC-NLPIR/EnvScaler at 87e6673:

- The user model gets the row's prompt as its system message and the agent's greeting
  :data:`OPENING` as the first message; its answer is the episode's first user message
  (``get_init_reply`` in ``interact_with_env/envscaler_env/utils/user_agent.py``,
  ``get_initial_observation`` in ``interact_with_env/envscaler_env/rl_conv_env.py``).
- Each agent message the user sees carries the prefix :data:`AGENT_PREFIX` (``user_step``,
  user_agent.py). A user reply holding ``###STOP###`` is exactly ``###STOP###``; otherwise the user's
  message is the text after ``# Reply:`` (following ``# Thought:``); an unreadable reply is drawn
  again, at most 5 times, after which the message is empty (``_infer``, ``_parse_response``,
  user_agent.py). The user keeps its raw replies in its own history.
- An agent reply is read as in the non-conversational episodes
  (:func:`.envscaler_rules.official_action`, ``step`` in ``interact_with_env/envscaler_env/base_env.py``):
  a reply without a tool call, or a ``chat_with_user`` call with a ``content``, goes to the user,
  whose answer is the next observation (a user message). No agent action ends the episode
  (``is_action_terminated`` returns False, rl_conv_env.py): "Task Completed" is one more message to
  the user.
- The user's ``###STOP###`` in answer to a chat action ends the episode and scores the final state
  (``is_observation_terminated``, rl_conv_env.py; reward: share of checks passed, 4 decimals,
  ``calculate_reward`` in base_env.py).
- A tool that raises ends the episode with reward 0 (``step``, base_env.py); an empty reply ends it
  with 0 (``TaskSolveAgent.step`` in ``interact_with_env/agent/task_solve_agent.py``); reaching
  :data:`CONV_MAX_STEPS` agent steps without ``###STOP###`` ends it with 0 (``max_steps_map`` in
  ``interact_with_env/run_main.py`` gives ``envscaler_conversation_rl`` 40 steps;
  ``TaskSolveAgent.run`` stops there and the reward of an unterminated episode stays 0).
- Under the ``lenient`` episode rules a raising tool is an observation and the step cap scores the
  final state; the rest is as above.
"""
from __future__ import annotations

import re
from typing import Protocol

from stages.envs.acebench_multi import SimulatedUser

CONV_MAX_STEPS = 40  # agent steps of a conversational episode (run_main.py, envscaler_conversation_rl)
OPENING = "[Agent] Hi! How can I help you today?"  # user_agent.py, get_init_reply
AGENT_PREFIX = "[Agent] "  # user_agent.py, user_step
STOP = "###STOP###"
USER_TRIES = 5  # user_agent.py, _infer
_REPLY = re.compile(r"# Thought:\s*(.*?)\s*# Reply:\s*(.*)", re.DOTALL)

USER_PROMPT = """You are a person talking to an assistant agent. Get the agent to reach this goal:

{task}

How to talk:
- Do not repeat the goal word for word or all at once; reveal it bit by bit over several messages.
- If the goal has several parts, bring them up one at a time, as the agent asks.
- If the goal needs several pieces of information, give them a few at a time, when the agent asks.
- Ask for nothing the goal does not ask for, and never invent information the goal does not give.
- Keep the conversation on the goal until every part of it is done.
- Keep the goal's keywords, names and proper nouns exactly as written.
- If the agent offers options, pick only ones that fit the goal; if none does, decline politely and restate what you need.
- Do not repeat what you already said unless the agent asks.
- Talk naturally, not formally.
- When the goal is reached, reply with ###STOP### alone.

Write every reply in this form:
# Thought:
<your reasoning; the agent does not see it>
# Reply:
<your message to the agent>"""

CONV_NOTE = (
    "## How to act\n"
    "You serve a user in this environment, step by step, until the user ends the conversation. "
    "Each step, either call one tool by writing\n"
    '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>\n'
    "or write a message to the user (plain text, no tool call). Each tool result comes back in a "
    "tool message, each user answer in a user message. Ask the user for information you need that "
    "the tools cannot give; never call a tool and talk to the user in the same step. When the task "
    "is done, tell the user the result and ask whether they need anything else."
)


class User(Protocol):
    """What a conversational episode needs of its simulated user."""

    def opening(self) -> str:
        """The user's first message (its answer to :data:`OPENING`)."""

    def reply(self, agent_message: str) -> str:
        """The user's answer to one agent message (``###STOP###`` ends the episode)."""


def parse_user_reply(text: str) -> str | None:
    """The user's message in one raw user-model reply: ``###STOP###`` when the reply holds it, else
    the text after ``# Reply:``; None when the reply has neither (``_parse_response`` in
    ``interact_with_env/envscaler_env/utils/user_agent.py``)."""
    if STOP in text:
        return STOP
    match = _REPLY.search(text)
    return match.group(2).strip() if match else None


class EnvScalerUser(SimulatedUser):
    """The user of one conversational episode, played by ``model`` with the task's ``system_prompt``.

    The user model is greedy (a redrawn reply would be the same text), so one draw stands for
    EnvScaler's :data:`USER_TRIES`: an unreadable reply gives an empty message, as 5 unreadable
    draws do upstream. Replies of up to ``max_new_tokens`` tokens are kept whole.

    Raises:
        FileNotFoundError: the model cannot be found (see :func:`stages.core.models.backbone.load_policy`).
    """

    def __init__(self, model: str, system_prompt: str, max_new_tokens: int = 1000):
        super().__init__(model, "", max_new_tokens=max_new_tokens, whole_reply=True)
        self.messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": OPENING}]

    def opening(self) -> str:
        """The user's first message (its answer to :data:`OPENING`)."""
        return parse_user_reply(self._say()) or ""

    def reply(self, agent_message: str) -> str:
        """The user's answer to one agent message (sent with :data:`AGENT_PREFIX`)."""
        self.messages.append({"role": "user", "content": AGENT_PREFIX + agent_message})
        return parse_user_reply(self._say()) or ""


def start_user(model: str, system_prompt: str) -> User:
    """The simulated user of one conversational episode (tests replace this with a scripted user).

    Raises:
        FileNotFoundError: the model cannot be found.
    """
    return EnvScalerUser(model, system_prompt)


def conv_system_prompt(env_prompt: str, tool_note: str) -> str:
    """The agent's system message of a conversational episode: the environment's system message
    ``env_prompt`` with its closing ``tool_note`` replaced by :data:`CONV_NOTE` (EnvScaler gives
    conversational agents their own rules: ``conversational_system_prompt`` in
    ``interact_with_env/agent/system_prompt_util.py``)."""
    body = env_prompt[: -len(tool_note)] if env_prompt.endswith(tool_note) else env_prompt + "\n\n"
    return body + CONV_NOTE
