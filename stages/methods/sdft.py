"""SDFT: self-distillation fine-tuning in the on-policy loop, as configured in B.1 of the LOPD paper.

Teacher view (B.1, as SDFT's official code): an exponential moving average of the student (rate
0.01 per optimizer step: T <- 0.99 T + 0.01 S; a LoRA student's teacher is a ``teacher``
adapter initialised as a copy of the student adapter and updated parameter-wise) re-scores the
student's own sampled tokens with a verified demonstration of the same task appended to the
FIRST USER message (framing: :data:`USER_FRAMING`, our wording of the SDFT prompt: "an example
for a response to the question ... now answer with a response of your own"). The student
sees only the task.

Loss: forward KL(T || S) over the full vocabulary at every sampled action token, token-mean
per sequence, then the mean over sequences (SDFT's official code) =
:func:`stages.core.losses.kd.forward_kl`; no reward term. A task without a verified
demonstration (:func:`stages.methods._text_context.verified_references`) is masked and counted
in ``no_context_frac`` (upstream requires a demonstration; masking is lopd's choice).

Upstream choices as options (``-o KEY=VALUE``): ``teacher=frozen`` (TRL's and tinker's frozen
base teacher), ``beta=0.5`` (TRL's JSD, here over the full vocabulary), ``reduction=token``.
"""
from __future__ import annotations

from stages.methods import register
from stages.methods._text_context import ReferenceMethod
from stages.methods.options import SDFTOptions

USER_FRAMING = (
    "Below is one verified, successful way of completing this task:\n\n{demonstration}\n\n"
    "Now complete the task with a response of your own, reasoning it through yourself."
)


@register("sdft")
class SDFT(ReferenceMethod):
    """SDFT (module docstring): demonstration in the first user message, EMA teacher."""

    Options = SDFTOptions
    loss_metrics = ("forward_kl", "reverse_kl")
    metrics = loss_metrics + ("no_context_frac", "context_tokens")

    def framing(self, demonstration: str) -> dict[str, str]:
        return {"user": USER_FRAMING.format(demonstration=demonstration)}
