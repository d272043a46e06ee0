"""Policy-gradient losses of the GRPO and Skill-SD baselines, as pure tensor functions.

Sources: B.1 of the LOPD paper, TRL's GRPO trainer and the Skill-SD paper (arXiv 2604.10674). Conventions are those of
:mod:`stages.core.losses.lopd`: every function takes ALREADY-ALIGNED tensors (``logp_BT[b, t]`` is
the log-probability of the token at that position, ``mask_BT[b, t]`` says whether it is a
supervised action token); masks are bool or 0/1 floats; each loss returns ``(loss, metrics)``
with a scalar tensor and plain floats.

Shapes: B = rows (training sequences), T = positions, G = groups (tasks of a step).

Aggregation (:func:`aggregate`), so that a step's loss accumulates exactly over micro-batches:
every loss is a SUM over this batch's masked tokens divided by a ``denominator`` that the
caller may fix for the whole step (default: this batch's own):

* ``"token-mean"`` (DAPO / the default): sum over tokens / number of masked tokens of the step.
* ``"seq-mean"`` (original GRPO): each row's token-mean, summed, / number of rows of the step.
* ``"constant"`` (Dr.GRPO): sum over tokens / a constant (e.g. rows x max completion length).

A batch with no masked token gives 0 with a defined (all-zero) gradient, never NaN.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from stages.core.losses import DEFAULT_CHUNK_SIZE
from stages.core.losses.chunking import check_chunk_size, run_chunk, token_logprob_rows

Aggregation = Literal["token-mean", "seq-mean", "constant"]
AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean", "constant")


def _float_mask(mask_BT: Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """``mask_BT`` as 0/1 of ``dtype``; ValueError on a wrong shape or non-0/1 values."""
    if tuple(mask_BT.shape) != tuple(shape):
        raise ValueError(f"mask shape {tuple(mask_BT.shape)} != expected {tuple(shape)}")
    if mask_BT.dtype != torch.bool and not bool(((mask_BT == 0) | (mask_BT == 1)).all()):
        raise ValueError("mask must be bool or hold only 0/1 values")
    return (mask_BT != 0).to(dtype)


def _check_pair(a_BT: Tensor, b_BT: Tensor, names: str) -> None:
    if a_BT.dim() != 2 or a_BT.shape != b_BT.shape:
        raise ValueError(f"{names} must both be (B, T), got {tuple(a_BT.shape)} and {tuple(b_BT.shape)}")


def token_logprobs(logits_BTV: Tensor, ids_BT: Tensor, temperature: float = 1.0,
                   chunk_size: int = DEFAULT_CHUNK_SIZE) -> Tensor:
    """log softmax(logits / temperature)[id] at every position: the policy's log-prob of a token.

    The ratio of PPO needs the log-prob under the SAME distribution the rollout engine sampled
    from (``log_softmax(raw_logits / temperature)``, see :class:`stages.engines.Generation`),
    so training forwards divide by the sampling temperature too (as verl and TRL do). Runs on
    chunks of about ``chunk_size`` positions under activation checkpointing (one chunk's
    [chunk x V] log-softmax alive at a time); differentiable w.r.t. the logits.

    Args:
        logits_BTV: float (B, T, V), aligned with ``ids_BT``.
        ids_BT: int64 (B, T), entries in [0, V).
        temperature: > 0 (pass 1.0 for greedy sampling, whose log-probs are at temperature 1).
        chunk_size: >= 1.

    Returns:
        logp_BT: float32 (float64 for float64 logits) log-probabilities in nats.

    Raises:
        ValueError: shape mismatch, id outside [0, V), temperature <= 0, chunk_size < 1.
    """
    check_chunk_size(chunk_size)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits_BTV.dim() != 3 or tuple(ids_BT.shape) != tuple(logits_BTV.shape[:2]):
        raise ValueError(f"expected logits (B, T, V) and ids (B, T), got {tuple(logits_BTV.shape)} "
                         f"and {tuple(ids_BT.shape)}")
    if ids_BT.numel() and (int(ids_BT.min()) < 0 or int(ids_BT.max()) >= logits_BTV.shape[-1]):
        raise ValueError(f"token ids must lie in [0, {logits_BTV.shape[-1]})")

    def scaled(lg: Tensor, ids: Tensor) -> Tensor:
        return token_logprob_rows(lg / temperature if temperature != 1.0 else lg, ids)

    steps = max(1, -(-chunk_size // max(logits_BTV.shape[0], 1)))
    parts = [run_chunk(scaled, lg, ids)
             for lg, ids in zip(logits_BTV.split(steps, dim=1), ids_BT.split(steps, dim=1))]
    return torch.cat(parts, dim=1)


def group_advantages(rewards_N: Tensor, group_N: Tensor, *, scale_std: bool = True,
                     eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """GRPO's group-normalised outcome advantages A_i = (r_i - mean_g) / (std_g + eps).

    GRPO (as TRL's ``scale_rewards=group``). Every rollout i belongs to group ``group_N[i]`` (the G rollouts of one
    task); std is the unbiased sample std within the group (as TRL); ``scale_std=False`` gives
    r_i - mean_g
    (Dr.GRPO, the SDPO repo's GRPO). A group whose rewards are all equal (including a group of
    one) is a zero-variance group: every advantage in it is exactly 0.

    Args:
        rewards_N: float (N,) rewards.
        group_N: int64 (N,) group index of each rollout, values in [0, G).
        scale_std: divide by the group std.
        eps: added to the std, > 0.

    Returns:
        advantages_N: float64 (N,); zero_var_G: bool (G,), True for zero-variance groups (G =
        max group index + 1; indices without rollouts count as zero-variance).

    Raises:
        ValueError: shapes differ or are not 1-D, a negative group index, eps <= 0.
    """
    if rewards_N.dim() != 1 or rewards_N.shape != group_N.shape:
        raise ValueError(f"rewards and groups must both be (N,), got {tuple(rewards_N.shape)} "
                         f"and {tuple(group_N.shape)}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if group_N.numel() and int(group_N.min()) < 0:
        raise ValueError("group indices must be >= 0")
    r_N = rewards_N.detach().to(torch.float64)
    G = int(group_N.max()) + 1 if group_N.numel() else 0
    count_G = torch.bincount(group_N, minlength=G).to(torch.float64)
    mean_G = r_N.new_zeros(G).index_add(0, group_N, r_N) / count_G.clamp(min=1)
    centred_N = r_N - mean_G[group_N]
    var_G = r_N.new_zeros(G).index_add(0, group_N, centred_N ** 2) / (count_G - 1).clamp(min=1)
    zero_var_G = torch.tensor([bool(((members := r_N[group_N == g]) == members[:1]).all()) if count_G[g] >= 2
                               else True for g in range(G)], dtype=torch.bool, device=r_N.device)
    adv_N = centred_N / (var_G.sqrt()[group_N] + eps) if scale_std else centred_N
    return torch.where(zero_var_G[group_N], torch.zeros_like(adv_N), adv_N), zero_var_G


def aggregate(values_BT: Tensor, mask_BT: Tensor, aggregation: Aggregation = "token-mean",
              denominator: float | None = None) -> Tensor:
    """Reduce per-token values to a scalar loss (module docstring: aggregation).

    Args:
        values_BT: float (B, T) per-token values (masked positions only count).
        mask_BT: bool or 0/1 (B, T).
        aggregation: "token-mean", "seq-mean" or "constant".
        denominator: the step's normaliser: masked tokens ("token-mean"), rows with a masked
            token ("seq-mean") or the constant ("constant", required). None = this batch's
            own count (values <= 0 count as 1).

    Returns:
        Scalar tensor of ``values_BT``'s dtype.

    Raises:
        ValueError: unknown aggregation, "constant" without a denominator, bad mask.
    """
    m_BT = _float_mask(mask_BT, tuple(values_BT.shape), values_BT.dtype)
    masked_BT = torch.where(m_BT > 0, values_BT, torch.zeros_like(values_BT))  # NaN-safe off the mask
    if aggregation == "token-mean":
        return masked_BT.sum() / max(float(m_BT.sum()) if denominator is None else denominator, 1.0)
    if aggregation == "seq-mean":
        count_B = m_BT.sum(dim=1)
        per_row = masked_BT.sum(dim=1) / count_B.clamp(min=1.0)
        return per_row.sum() / max(float((count_B > 0).sum()) if denominator is None else denominator, 1.0)
    if aggregation == "constant":
        if denominator is None or denominator <= 0:
            raise ValueError("aggregation 'constant' needs a positive denominator (e.g. rows x max tokens)")
        return masked_BT.sum() / denominator
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def truncated_is_weights(old_logp_BT: Tensor, behaviour_logp_BT: Tensor, mask_BT: Tensor, *,
                         cap: float = 2.0) -> tuple[Tensor, dict[str, float]]:
    """Token-level truncated importance weights min(pi_old / pi_behaviour, cap) (TIS).

    The rollout correction of verl (``rollout_is``, token level): the rollout engine sampled
    from pi_behaviour (its recorded log-probs: another kernel, a KV cache, bf16 rounding), while
    pi_old is the training forward's value of the same tokens before the update; the weight
    re-weights each token's loss toward pi_old's distribution, truncated at ``cap``. Detached.

    Args:
        old_logp_BT: float (B, T) pi_old log-probs of the sampled tokens (nats).
        behaviour_logp_BT: float (B, T) the engine's recorded log-probs (NaN = not recorded).
        mask_BT: bool or 0/1 (B, T).
        cap: upper truncation of the weight, > 0.

    Returns:
        weights_BT: (B, T) of ``old_logp_BT``'s dtype, 1 off the mask and where nothing was
        recorded; metrics: rollout_is_mean (masked mean weight), rollout_is_clip_frac (share of
        recorded masked tokens truncated), rollout_logp_abs_diff (masked mean |log pi_old - log
        pi_behaviour| over recorded tokens, nats).

    Raises:
        ValueError: shape mismatch, bad mask, cap <= 0.
    """
    _check_pair(old_logp_BT, behaviour_logp_BT, "old_logp and behaviour_logp")
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    m_BT = _float_mask(mask_BT, tuple(old_logp_BT.shape), old_logp_BT.dtype) > 0
    behaviour_BT = behaviour_logp_BT.detach().to(old_logp_BT.dtype)
    known_BT = m_BT & ~torch.isnan(behaviour_BT)
    diff_BT = torch.where(known_BT, old_logp_BT.detach() - behaviour_BT, torch.zeros_like(behaviour_BT))
    raw_BT = torch.exp(diff_BT.clamp(max=math.log(cap)))  # never above cap, never overflows
    weights_BT = torch.where(known_BT, raw_BT, torch.ones_like(raw_BT))
    n, k = int(m_BT.sum()), int(known_BT.sum())
    return weights_BT, {"rollout_is_mean": float(weights_BT[m_BT].mean()) if n else 1.0,
                        "rollout_is_clip_frac": float((diff_BT[known_BT] >= math.log(cap)).double().mean()) if k
                        else 0.0,
                        "rollout_logp_abs_diff": float(diff_BT[known_BT].abs().mean()) if k else 0.0}


def ppo_clip_loss(logp_BT: Tensor, old_logp_BT: Tensor, advantages_B: Tensor, mask_BT: Tensor, *,
                  eps_lo: float = 0.2, eps_hi: float = 0.2, aggregation: Aggregation = "token-mean",
                  denominator: float | None = None,
                  weights_BT: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """PPO-clip surrogate of GRPO: -min(rho A, clip(rho, 1 - eps_lo, 1 + eps_hi) A) per token.

    GRPO (B.1 of the LOPD paper: eps 0.2/0.2; Skill-SD and DAPO: 0.2/0.28).
    rho = exp(logp - sg(old_logp)) is the token-level ratio against pi_old, the policy before
    this step's first update (the training forward's log-probs then, as verl and TRL compute
    them: rho is exactly 1 in the first epoch); A is the row's advantage, shared by every token
    of it. The gradient reaches ``logp_BT`` only.

    Args:
        logp_BT: float (B, T) current-policy log-probs of the sampled tokens (differentiable).
        old_logp_BT: float (B, T) pi_old log-probs (finite on masked positions).
        advantages_B: float (B,) advantage per row.
        mask_BT: bool or 0/1 (B, T), supervised positions.
        eps_lo, eps_hi: clip range [1 - eps_lo, 1 + eps_hi], each >= 0 (eps_lo < 1).
        aggregation, denominator: see :func:`aggregate`.
        weights_BT: float (B, T) per-token weights of the surrogate (detached), e.g. the
            rollout correction's :func:`truncated_is_weights`; None = 1.

    Returns:
        loss: scalar tensor (nats-scaled surrogate).
        metrics: pg_loss (loss value), clip_frac / clip_frac_low / clip_frac_high (share of
        masked tokens whose clipped branch is active: rho < 1 - eps_lo with A < 0, rho >
        1 + eps_hi with A > 0), ratio_mean and ratio_max (over masked tokens), num_tokens.

    Raises:
        ValueError: shape mismatch, bad mask, eps out of range, non-finite old log-probs on a
            masked position, unknown aggregation.
    """
    _check_pair(logp_BT, old_logp_BT, "logp and old_logp")
    B = logp_BT.shape[0]
    if tuple(advantages_B.shape) != (B,):
        raise ValueError(f"advantages must be ({B},), got {tuple(advantages_B.shape)}")
    if not (0.0 <= eps_lo < 1.0 and eps_hi >= 0.0):
        raise ValueError(f"need 0 <= eps_lo < 1 and eps_hi >= 0, got {eps_lo} and {eps_hi}")
    m_BT = _float_mask(mask_BT, tuple(logp_BT.shape), logp_BT.dtype) > 0
    old_BT = torch.where(m_BT, old_logp_BT.detach().to(logp_BT.dtype), logp_BT.detach())
    if not bool(torch.isfinite(old_BT[m_BT]).all()):
        raise ValueError("old log-probs must be finite on masked positions")
    ratio_BT = torch.exp(logp_BT - old_BT)
    adv_B1 = advantages_B.detach().to(logp_BT.dtype).unsqueeze(1)
    unclipped_BT = ratio_BT * adv_B1
    clipped_BT = ratio_BT.clamp(1.0 - eps_lo, 1.0 + eps_hi) * adv_B1
    per_token_BT = -torch.minimum(unclipped_BT, clipped_BT)
    if weights_BT is not None:
        _check_pair(logp_BT, weights_BT, "logp and weights")
        per_token_BT = per_token_BT * weights_BT.detach().to(logp_BT.dtype)
    loss = aggregate(per_token_BT, m_BT, aggregation, denominator)
    with torch.no_grad():
        n = int(m_BT.sum())
        r = ratio_BT[m_BT]
        a = adv_B1.expand_as(ratio_BT)[m_BT]
        low = ((r < 1.0 - eps_lo) & (a < 0)).double().sum().item()
        high = ((r > 1.0 + eps_hi) & (a > 0)).double().sum().item()
        metrics = {"pg_loss": float(loss.detach()), "clip_frac": (low + high) / max(n, 1),
                   "clip_frac_low": low / max(n, 1), "clip_frac_high": high / max(n, 1),
                   "ratio_mean": float(r.mean()) if n else 1.0, "ratio_max": float(r.max()) if n else 1.0,
                   "num_tokens": float(n)}
    return loss, metrics


def k3_kl(logp_BT: Tensor, ref_logp_BT: Tensor, mask_BT: Tensor, *, aggregation: Aggregation = "token-mean",
          denominator: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """KL(pi || pi_ref) by the k3 estimator on the sampled tokens: e^(ref - logp) - (ref - logp) - 1.

    GRPO's optional KL to the frozen initial policy (times beta). Non-negative per
    token, 0 where the two log-probs agree; the gradient reaches ``logp_BT`` only (the
    reference is detached).

    Args:
        logp_BT: float (B, T) current-policy log-probs (differentiable).
        ref_logp_BT: float (B, T) reference-policy log-probs of the same tokens.
        mask_BT: bool or 0/1 (B, T).
        aggregation, denominator: see :func:`aggregate`.

    Returns:
        loss: scalar tensor, nats; metrics: kl_ref (loss value), num_tokens.

    Raises:
        ValueError: shape mismatch, bad mask, unknown aggregation.
    """
    _check_pair(logp_BT, ref_logp_BT, "logp and ref_logp")
    m_BT = _float_mask(mask_BT, tuple(logp_BT.shape), logp_BT.dtype) > 0
    d_BT = torch.where(m_BT, ref_logp_BT.detach().to(logp_BT.dtype) - logp_BT, torch.zeros_like(logp_BT))
    loss = aggregate(torch.exp(d_BT) - d_BT - 1.0, m_BT, aggregation, denominator)
    return loss, {"kl_ref": float(loss.detach()), "num_tokens": float(m_BT.sum())}


def sampled_token_sdl(logp_BT: Tensor, teacher_logp_BT: Tensor, old_logp_BT: Tensor, mask_BT: Tensor, *,
                      ratio_clip: float | None = None, aggregation: Aggregation = "token-mean",
                      denominator: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """Skill-SD's self-distillation term on the sampled token: rho * (e^(-l) - 1 + l).

    Skill-SD (B.1 of the LOPD paper: "importance-weighted sampled-token reverse
    KL", weight 0.001 outside this function). With l = log S - log T at the sampled token and
    rho = S / sg(S_old) = exp(logp - sg(old_logp)), the per-token value is rho * (e^(-l) - 1 + l):
    the k3 estimate of KL(S || T), importance-weighted from pi_old's samples (S_old: the policy
    before the step's first update, as :func:`ppo_clip_loss` takes it). The
    teacher is detached; gradient reaches ``logp_BT`` through both rho and l. Whether the
    original clips rho is unverified: ``ratio_clip`` (e.g. 2.0) caps it, None = no cap.

    Args:
        logp_BT: float (B, T) student log-probs of the sampled tokens (differentiable).
        teacher_logp_BT: float (B, T) teacher log-probs of the same tokens (detached here).
        old_logp_BT: float (B, T) pi_old log-probs (finite on masked positions).
        mask_BT: bool or 0/1 (B, T).
        ratio_clip: upper cap on rho (> 0) or None.
        aggregation, denominator: see :func:`aggregate` (Skill-SD: mean over valid tokens).

    Returns:
        loss: scalar tensor, nats; metrics: sdl (loss value), sdl_gap (masked mean of l =
        log S - log T, nats), num_tokens.

    Raises:
        ValueError: shape mismatch, bad mask, non-finite old log-probs on a masked position,
            ratio_clip <= 0, unknown aggregation.
    """
    _check_pair(logp_BT, teacher_logp_BT, "logp and teacher_logp")
    _check_pair(logp_BT, old_logp_BT, "logp and old_logp")
    if ratio_clip is not None and ratio_clip <= 0:
        raise ValueError(f"ratio_clip must be > 0 or None, got {ratio_clip}")
    m_BT = _float_mask(mask_BT, tuple(logp_BT.shape), logp_BT.dtype) > 0
    zeros = torch.zeros_like(logp_BT)
    old_BT = torch.where(m_BT, old_logp_BT.detach().to(logp_BT.dtype), logp_BT.detach())
    if not bool(torch.isfinite(old_BT[m_BT]).all()):
        raise ValueError("old log-probs must be finite on masked positions")
    gap_BT = torch.where(m_BT, logp_BT - teacher_logp_BT.detach().to(logp_BT.dtype), zeros)
    ratio_BT = torch.exp(torch.where(m_BT, logp_BT - old_BT, zeros))
    if ratio_clip is not None:
        ratio_BT = ratio_BT.clamp(max=ratio_clip)
    loss = aggregate(ratio_BT * (torch.exp(-gap_BT) - 1.0 + gap_BT), m_BT, aggregation, denominator)
    n = int(m_BT.sum())
    return loss, {"sdl": float(loss.detach()), "sdl_gap": float(gap_BT.detach()[m_BT].mean()) if n else 0.0,
                  "num_tokens": float(n)}
