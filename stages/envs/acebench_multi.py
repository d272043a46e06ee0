"""The simulated user of ACEBench's agent multi-turn tasks (:class:`stages.envs.acebench.AceBenchEnv`).

In a multi-turn task the request is not given up front: a user model is told the instruction
(the task's ``question``, e.g. "Your name is Grace. You want to send a message to Frank ...") and
talks to the agent one line at a time, as ACEBench's ``APIModel_user`` does with an API model: it
first answers the agent-side opening "Is there anything you need help with today?", then every
agent reply without a tool call; a line holding "finish conversation" ends the dialogue. Its
system prompt states ACEBench's user rules in our words: those for the phone-platform user, or, for
tasks on the Travel class, those for the airline customer (``APIModel_user`` picks them by the
task's involved classes the same way). The user model is any causal LM ``lopd`` can load (the
embedded one, an HF id or a folder), greedy (ACEBench samples at temperature 0.001), loaded once
per process. ACEBench's user writes up to 1,000 tokens and its whole reply is kept
(``max_new_tokens=1000, whole_reply=True``); the lenient setting keeps the first line of 64 tokens.
With ``language="zh"`` the user gets ACEBench's Chinese rules and opening word for word
(:func:`stages.envs.acebench_prompts_zh.user_prompt_zh`, ``OPENING_ZH``).
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from stages.envs.acebench_prompts_zh import OPENING_ZH, user_prompt_zh

USER_PROMPT = """You are a user talking to an assistant agent that operates your phone for you.

Your instruction: {instruction}

Rules:
- Write one line per message, as that user would.
- Do not reveal the whole instruction at once: give what the current step needs, and all of it (for a reminder: its title, description and time).
- Never make up information the instruction does not give; if asked for something you do not know, say that you do not know.
- Names in the instruction are full names; you are the person the instruction names as you.
- When the agent asks which message to delete, answer as the instruction says.
- Do not offer the agent help; answer its questions as the instruction says.
- When the agent asks whether you need anything else, check that every task of the instruction is done; if one is not, ask for it.
- When every task is done, write a line with only: finish conversation
"""
TRAVEL_USER_PROMPT = """You are a user talking to an airline agent that books, changes and cancels flights for you.

Your instruction: {instruction}

Rules:
- Write one line per message, as that user would.
- Do not reveal the whole instruction at once: give only what the current step needs.
- Never make up information the instruction does not give (a reservation id, for example); if asked for something you do not know, say that you do not remember it or do not have it.
- When the agent asks you to confirm something, confirm or decline as the instruction says.
- Do not recite the instruction; say the same things in your own words.
- Keep the conversation natural and stay the person the instruction describes.
- If the instruction asks for a round trip, say at the very start that you want to book a round-trip flight.
- When the goal of the instruction is reached, write a line with only: finish conversation
"""
OPENING = "Is there anything you need help with today?"
FINISH = "finish conversation"


def user_prompt(instruction: str, involved_classes: Sequence[str], language: str = "en") -> str:
    """The simulated user's system prompt: English, the travel rules for tasks on the Travel class, else the
    phone rules; "zh": ACEBench's Chinese prompt (:func:`.acebench_prompts_zh.user_prompt_zh`, which raises
    ValueError for a task on neither BaseApi nor Travel)."""
    if language == "zh":
        return user_prompt_zh(instruction, involved_classes)
    rules = TRAVEL_USER_PROMPT if "Travel" in involved_classes else USER_PROMPT
    return rules.format(instruction=instruction)


@lru_cache(maxsize=2)
def _load(name: str) -> tuple[Any, Any]:
    from stages.core.models.backbone import load_policy

    return load_policy(name)


class SimulatedUser:
    """One dialogue's user, played by ``model`` (module docstring); ``involved_classes`` and ``language``
    ("en" or "zh") pick its rules and opening.

    Raises:
        FileNotFoundError: the model cannot be found (see :func:`stages.core.models.backbone.load_policy`).
    """

    def __init__(self, model: str, instruction: str, involved_classes: Sequence[str] = (), max_new_tokens: int = 64,
                 whole_reply: bool = False, language: str = "en"):
        self.model, self.tokenizer = _load(model)
        self.max_new_tokens, self.whole_reply = max_new_tokens, whole_reply
        # the user model's own view: the agent speaks as "user", the simulated user as "assistant"
        self.messages = [{"role": "system", "content": user_prompt(instruction, involved_classes, language)},
                         {"role": "user", "content": OPENING_ZH if language == "zh" else OPENING}]

    def opening(self) -> str:
        """The user's first message (its answer to the opening question)."""
        return self._say()

    def reply(self, agent_message: str) -> str:
        """The user's answer to an agent message."""
        self.messages.append({"role": "user", "content": agent_message})
        return self._say()

    @staticmethod
    def finished(message: str) -> bool:
        """Whether ``message`` ends the dialogue ("finish conversation" in it)."""
        return FINISH in message.lower()

    def _say(self) -> str:
        import torch

        text = self.tokenizer.apply_chat_template(self.messages, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(self.model.device), attention_mask=torch.ones_like(ids),
                                      max_new_tokens=self.max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id)
        text = self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
        said = text if self.whole_reply else next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        said = said[len("user:"):].strip() if said.lower().startswith("user:") else said
        self.messages.append({"role": "assistant", "content": said})
        return said
