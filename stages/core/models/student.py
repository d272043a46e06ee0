"""The student's forward: logits of pi_theta^S (the LoRA adapter ``student`` of the shared backbone,
or a plain model under full fine-tuning).

Alignment: ``logits[b, i]`` = distribution of token ``i + 1`` (the Hugging Face convention;
callers shift, see :func:`stages.core.latent.contexts.shift_for_loss`), the same as the teachers of
:mod:`stages.core.latent.teacher`.
"""
from __future__ import annotations

from torch import Tensor, nn

from stages.core.models.composer import adapter_scope
from stages.core.models.head import forward_outputs

STUDENT_ADAPTER = "student"


def student_logits(
    backbone: nn.Module, input_ids_BT: Tensor, attn_mask_BT: Tensor, adapter: str | None = STUDENT_ADAPTER,
    *, hidden: bool = False,
) -> Tensor:
    """Student logits_BTV (B, T, V) of pi_theta^S on right-padded token ids; with ``hidden`` the
    decoder's last hidden states (B, T, d) instead, the LM head not applied
    (:mod:`stages.core.models.head`).

    Args:
        backbone: shared peft backbone, or a plain model (full fine-tuning).
        input_ids_BT: LongTensor (B, T); attn_mask_BT: (B, T) bool or 0/1.
        adapter: LoRA adapter of the student; None runs the base weights with every adapter
            disabled (full fine-tuning, where the teacher must be a separate frozen copy).

    Raises:
        ValueError: ``adapter`` is not an adapter of ``backbone``.
    """
    with adapter_scope(backbone, adapter):
        return forward_outputs(backbone, hidden, input_ids=input_ids_BT, attention_mask=attn_mask_BT.long(),
                               use_cache=False)
