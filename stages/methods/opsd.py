"""OPSD: on-policy self-distillation with a privileged reference, as configured in B.1 of the LOPD paper.

Teacher view (B.1, as OPSD's paper): the FROZEN initial weights (a LoRA student's backbone
with every adapter disabled, as upstream's ``--fixed_teacher``) re-score the student's own
sampled tokens with the verified reference of the same task in the SYSTEM message, framed as a
reference plan for guidance only: the model must still act in the environment itself and
derive the result on its own (:data:`SYSTEM_FRAMING`, our wording). The student sees the plain
task.

Loss (B.1): forward KL(T || S) over the full vocabulary at every sampled action token
(:func:`stages.core.losses.kd.generalized_jsd` with ``beta=0``), pooled over the step's action
tokens (``reduction="token"``: upstream sums and divides by the completion-token count; B.1 does
not say). A task without a verified reference is masked and counted in ``no_context_frac``
(upstream always has a solution; masking is lopd's choice).

Upstream choices as options (``-o KEY=VALUE``): ``beta=0.5`` (the generalised JSD of the
paper and scripts), ``teacher=current`` (the code's default: current weights under no_grad),
``teacher=ema`` with ``ema_rate=0.001`` (its optional EMA 0.999), ``loss_temperature=T``
(upstream divides the logits by the sampling temperature), ``reduction=sequence``.
"""
from __future__ import annotations

from stages.methods import register
from stages.methods._text_context import ReferenceMethod
from stages.methods.options import OPSDOptions

SYSTEM_FRAMING = (
    "Reference plan for the current task (guidance only). It shows one verified way to solve "
    "the task:\n\n{demonstration}\n\nYou must still interact with the environment yourself, one "
    "step at a time: do not copy the plan blindly, derive the same result with your own reasoning."
)


@register("opsd")
class OPSD(ReferenceMethod):
    """OPSD (module docstring): reference in the system message, frozen teacher."""

    Options = OPSDOptions
    loss_metrics = ("kd_loss", "forward_kl", "reverse_kl")
    metrics = loss_metrics + ("no_context_frac", "context_tokens")

    def framing(self, demonstration: str) -> dict[str, str]:
        return {"system": SYSTEM_FRAMING.format(demonstration=demonstration)}
