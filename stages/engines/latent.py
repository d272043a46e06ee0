"""Generation conditioned on retrieved latents: the frozen base model + composer (Table 3's
"base + composer" row of the LOPD paper).

:class:`LatentEngine` is an ``hf`` engine whose prompts get the J*K latents c_phi of their task,
placed as in training (the composer's ``placement``, :mod:`stages.core.latent.placements`: ``prefix``
right after the episode's opening prompt, ``framed`` inside the first user message between the
framing texts, ``per-turn`` right before every action, i.e. at the end of each prompt).

The rollout loop announces each episode with :meth:`LatentEngine.begin_episode` (task, opening
messages and prompt ids): the engine retrieves J successful TRAIN-split experiences of other
tasks of the same environment, runs the composer once, and remembers the latents under the
opening prompt ids. A later prompt of the episode starts with those ids; one that does not (a
prompt rendered anew after the environment changed its tools) is generated without latents and
counted in ``unconditioned``. The whole prompt is embedded, the latents written in, and
``generate`` runs on ``inputs_embeds`` with every adapter disabled (A.4: the encoder LoRA is off
in the main forward). No prefix cache.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig

from schemas import Message, Task
from stages.core.latent.contexts import encode_experiences
from stages.core.latent.placements import get_placement
from stages.core.models.composer import Composer, adapter_scope
from stages.engines.hf import HFRolloutEngine


class LatentEngine(HFRolloutEngine):
    """An ``hf`` engine that conditions every prompt on its task's retrieved latents.

    Args:
        model: the backbone the composer was loaded on (a peft model holding its adapter).
        tokenizer: its tokenizer (pad token set).
        composer: the composer (frozen; its ``hparams`` give J and the token cap).
        retriever: :class:`stages.core.data.retrieval.Retriever` over the experience store.
        placement: a name of :data:`stages.core.latent.placements.PLACEMENTS` (the composer's, from
            its config).
        batch_size: prompts per ``generate`` call.

    Raises:
        ValueError: an unknown placement (and see :class:`HFRolloutEngine`).
    """

    def __init__(self, model, tokenizer, composer: Composer, retriever: Any, *, placement: str = "prefix",
                 batch_size: int = 8):
        self.placement = get_placement(placement)
        super().__init__(model, tokenizer, batch_size=batch_size)
        self.composer, self.retriever = composer, retriever
        self._episodes: dict[tuple[int, ...], tuple[list[int], torch.Tensor, list[int]]] = {}
        self.unconditioned = 0
        self.retrieved: dict[str, list[str]] = {}  # task id -> trajectory ids of its experiences

    @property
    def context_window(self) -> int | None:
        """The model's window less the J*K latent positions every conditioned prompt gets."""
        window = super().context_window
        return None if window is None else window - self.composer.hparams["J"] * self.composer.hparams["K"]

    def begin_episode(self, task: Task, messages: list[Message], tools: list[dict], prompt_ids: list[int]) -> None:
        """Retrieve the task's experiences, compute its latents c_phi (N, d), remember them.

        Experiences: successful, TRAIN split, same environment, never the task itself.
        """
        J = self.composer.hparams["J"]
        found = self.retriever.retrieve(task.prompt, J, env=task.env, split="train", exclude_task_ids={task.task_id})
        exps = [e.trajectory for e in found]
        self.retrieved[task.task_id] = [t.trajectory_id for t in exps]
        ids_JL, mask_JL = encode_experiences(self.tokenizer, task.prompt, exps, J,
                                             self.composer.hparams["max_exp_tokens"] or 512)
        with torch.inference_mode():
            latents_Nd = self.composer(ids_JL.unsqueeze(0).to(self.device), mask_JL.unsqueeze(0).to(self.device))[0]
        head, tail = self.placement.opening(self.tokenizer, messages, tools, task.env, prompt_ids)
        self._episodes[tuple(prompt_ids)] = (head, latents_Nd, tail)

    def retrieval_note(self) -> str:
        """One line on what the episodes so far retrieved: ``"retrieval: experiences for 38 of 40
        tasks (2.9 per task, J=3; 2 tasks got none)"``."""
        n, J = len(self.retrieved), self.composer.hparams["J"]
        served = sum(1 for ids in self.retrieved.values() if ids)
        mean = sum(len(ids) for ids in self.retrieved.values()) / max(n, 1)
        none = f"; {n - served} task{'' if n - served == 1 else 's'} got none" if served < n else ""
        return f"retrieval: experiences for {served} of {n} tasks ({mean:.1f} per task, J={J}{none})"

    def _parts(self, prompt: list[int]) -> tuple[list[int], torch.Tensor | None, list[int]]:
        """(ids before the latents, latents or None, ids after) of one prompt."""
        for opening, (head, latents, tail) in self._episodes.items():
            if len(prompt) >= len(opening) and tuple(prompt[:len(opening)]) == opening:
                before, after = self.placement.prompt_parts(prompt, len(opening), head, tail)
                return before, latents, after
        self.unconditioned += 1
        return prompt, None, []

    def _new_tokens(self, prompts: list[list[int]], config: GenerationConfig, kwargs: dict) -> torch.Tensor:
        embed = self.model.get_input_embeddings()
        rows = []
        for prompt in prompts:
            head, latents, tail = self._parts(prompt)
            pieces = [embed(torch.tensor(head, device=self.device))]
            if latents is not None:
                pieces.append(latents.to(pieces[0].dtype))
            if tail:
                pieces.append(embed(torch.tensor(tail, device=self.device)))
            rows.append(torch.cat(pieces))
        width = max(len(r) for r in rows)
        d = rows[0].shape[-1]
        embeds_BSd = rows[0].new_zeros(len(rows), width, d)
        mask_BS = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        for i, row in enumerate(rows):  # left padding, as for ids
            embeds_BSd[i, width - len(row):] = row
            mask_BS[i, width - len(row):] = 1
        with adapter_scope(self.model, None):
            # from inputs_embeds, generate returns only the new tokens
            return self.model.generate(inputs_embeds=embeds_BSd, attention_mask=mask_BS,
                                       generation_config=config, **kwargs).cpu()
