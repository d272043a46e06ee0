"""The composer ladder: does the content of the latents change the teacher? (`lopd coldstart`, `lopd ladder`).

Teacher NLL of held-out reference actions under ten contexts, the rungs:

- (a) no latents (the plain frozen backbone);
- (b) the untrained composer (its seeded init) on the retrieved experiences;
- (c) the trained composer on the retrieved experiences, as deployed;
- (d) the trained composer on the experiences retrieved for a held-out target of ANOTHER task of
  the SAME environment (:func:`environments_of`, :func:`partners`);
- (e) the same for a held-out target of ANOTHER environment;
- (f) the trained composer with the target's own trajectory as its first experience (then the
  first J - 1 retrieved ones): the channel's capacity, an oracle;
- (g) the retrieved experiences as plain text, the composer's own input rows ("Current task: x /
  Related experience: ...") embedded as tokens and placed where the latents go (the text bound);
- (h) J x K free vectors, the same for every input (:class:`FreePrompt`), trained with the same
  objective, steps, learning rate and batches as the composer (the learned-prompt control);
- (h') a second composer built and trained as the run's on input rows blanked to the target's
  task text (:mod:`stages.coldstart.ladder.task_only`, its own lr chosen on training tasks): the
  like-with-like learned prompt, which reads everything (c) reads but the experiences;
- (i) (e)'s experiences, another environment's, as plain text like (g): how much of the text
  bound is the experiences' content and how much text in that place helps whatever it says.

(c) below (d) and (e) says the latents carry the experiences' content (reachable as far as (g)
is below (i)); (c) equal to (h) says the composer acts as a learned constant prompt, (c) equal to
(h') that it acts as a prompt learned from the task text, whatever the experiences say. Scores
are per target (sums of token NLL and token counts), pooled over all action tokens and over the
decisive ones (where (a) costs more than :data:`DECISIVE_NATS`), and compared in pairs over
targets (:func:`pooled_difference`). Latent diversity: the mean cosine similarity of the
flattened K x d latents of different composer rows (:func:`mean_pairwise_cosine`).
"""
from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Collection, Sequence
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel
from torch import Tensor, nn

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from schemas import Trajectory
from stages.coldstart.data import ColdstartData
from stages.coldstart.ladder.free_prompt import FREE_PROMPT, FreePrompt, free_prompt_of, kept
from stages.coldstart.ladder.heldout import HeldoutResult, swapped_phi
from stages.coldstart.ladder.task_only import TASK_ONLY, TaskOnlyControl, task_only_of
from stages.coldstart.ladder.task_only import kept as task_only_kept
from stages.coldstart.settings import RUNG_NAMES, ColdstartConfig, rung_list
from stages.core.latent.contexts import LatentBatch, build_batch, shift_for_loss
from stages.core.latent.placements import get_placement
from stages.core.latent.teacher import latent_teacher_logits, text_teacher_logits
from stages.core.models.composer import Composer
from stages.core.run.printing import titled_table
from stages.core.run.progress import StageProgress

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LADDER = "ladder.json"
DECISIVE_NATS = 1.0  # a token is decisive where the teacher without latents costs more than this
RUNGS: dict[str, str] = dict(zip(RUNG_NAMES, (
    "no latents",
    "untrained composer",
    "retrieved experiences (as deployed)",
    "another task's experiences, same environment",
    "another environment's experiences",
    "the target's own trajectory (oracle)",
    "retrieved experiences as plain text",
    "J x K free vectors (learned prompt)",
    "task-only composer (reads the task text, no experiences)",
    "another environment's experiences as plain text",
), strict=True))
# (x, y) pairs reported as x - y with paired standard errors
COMPARISONS: tuple[tuple[str, str], ...] = (("c", "a"), ("c", "d"), ("c", "e"), ("c", "h"), ("c", "h'"), ("h'", "h"),
                                            ("f", "a"), ("g", "a"), ("c", "g"), ("b", "a"), ("g", "i"))


class Difference(BaseModel):
    """x - y pooled over targets (nats per token) and its paired standard error, on all / decisive tokens."""

    x: str
    y: str
    diff: float
    se: float
    diff_decisive: float
    se_decisive: float


class Ladder(BaseModel):
    """The ladder of one composer on held-out targets.

    Attributes:
        nll, nll_decisive: per rung present, pooled NLL (nats per token) on all / decisive tokens.
        differences: the :data:`COMPARISONS` whose rungs are present.
        latent_cosine: mean cosine similarity of the latents of different composer rows (c);
            latent_cosine_untrained: the same for the untrained composer (b) (None: not scored).
        task_only_lr, task_only_sweep: the learning rate of the task-only composer (h') and the
            sweep that chose it (:class:`TaskOnlyControl`); None: (h') not scored.
        targets, tokens, decisive_tokens: how many targets / action tokens were scored.
        target_ids: the scored targets' trajectory ids.
        sums, sums_decisive: per rung, per target, the summed token NLL (nats); counts,
            counts_decisive: per target, its (decisive) action tokens.
    """

    nll: dict[str, float]
    nll_decisive: dict[str, float]
    differences: list[Difference]
    latent_cosine: float
    latent_cosine_untrained: float | None = None
    task_only_lr: float | None = None
    task_only_sweep: dict[str, float] | None = None
    targets: int
    tokens: int
    decisive_tokens: int
    target_ids: list[str]
    sums: dict[str, list[float]]
    sums_decisive: dict[str, list[float]]
    counts: list[int]
    counts_decisive: list[int]


# ---------------------------------------------------------------------------------------------
# Pure statistics
# ---------------------------------------------------------------------------------------------


def pooled_difference(x_sum_N: Sequence[float], y_sum_N: Sequence[float], count_N: Sequence[int]
                      ) -> tuple[float, float]:
    """Pooled per-token difference ``(sum x - sum y) / sum n`` over N targets and its paired SE.

    The targets are the sampling units (a ratio estimator over clusters): with d_i = x_i - y_i
    and D the pooled difference, SE = sqrt(N / (N - 1) * sum_i (d_i - D n_i)^2) / sum_i n_i.
    With equal counts this is the usual standard error of the mean per-target difference.
    Targets without tokens drop out; NaN SE with fewer than 2 targets, NaN both without tokens.
    """
    rows = [(x - y, n) for x, y, n in zip(x_sum_N, y_sum_N, count_N) if n > 0]
    total = sum(n for _, n in rows)
    if not total:
        return math.nan, math.nan
    D = sum(d for d, _ in rows) / total
    N = len(rows)
    if N < 2:
        return D, math.nan
    return D, math.sqrt(N / (N - 1) * sum((d - D * n) ** 2 for d, n in rows)) / total


def mean_pairwise_cosine(latents_NKd: Tensor) -> float:
    """Mean cosine similarity over all pairs r != s of the flattened rows latents_NKd[r] (K*d each).

    Raises:
        ValueError: fewer than 2 rows.
    """
    N = latents_NKd.shape[0]
    if N < 2:
        raise ValueError("mean_pairwise_cosine needs at least 2 rows")
    unit_ND = nn.functional.normalize(latents_NKd.reshape(N, -1).double(), dim=-1)
    cos_NN = unit_ND @ unit_ND.T
    return float((cos_NN.sum() - cos_NN.diagonal().sum()) / (N * (N - 1)))


# ---------------------------------------------------------------------------------------------
# Experiences of the rungs
# ---------------------------------------------------------------------------------------------


def environments_of(trajs: list[Trajectory]) -> list[str]:
    """Per trajectory, the environment its task belongs to: the task's ``metadata["env_id"]`` as
    its env lists it (EnvScaler-format envs, e.g. the bed's ``bed_banking_accounts``), else the
    trajectory's ``env`` (an env that cannot list its tasks, or tasks without an ``env_id``)."""
    from stages.envs import make_env

    out = []
    for traj in trajs:
        key = (traj.env, traj.split)
        if key not in _TASK_ENVS:
            try:
                env = make_env(traj.env)
                try:
                    _TASK_ENVS[key] = {t.task_id: str(t.meta.get("env_id") or traj.env) for t in env.tasks(traj.split)}
                finally:
                    env.close()
            except Exception:  # noqa: BLE001 - unknown env / missing data: the env name stands for it
                _TASK_ENVS[key] = {}
        out.append(_TASK_ENVS[key].get(traj.task_id, traj.env))
    return out


_TASK_ENVS: dict[tuple[str, str], dict[str, str]] = {}


def partner(i: int, task_ids: list[str], envs: list[str], experience_tasks: list[set[str]], same_env: bool
            ) -> int | None:
    """The first target j after i (cyclically) of another task, of the same environment as i
    (``same_env``) or of another one, none of whose experiences (``experience_tasks[j]``, their
    task ids) is of i's task (None: no such j)."""
    n = len(task_ids)
    for s in range(1, n):
        j = (i + s) % n
        if (task_ids[j] != task_ids[i] and (envs[j] == envs[i]) == same_env
                and task_ids[i] not in experience_tasks[j]):
            return j
    return None


def partners(targets: list[Trajectory], experiences: list[list[Trajectory]], envs: list[str]
             ) -> dict[bool, list[int | None]]:
    """Per target, its :func:`partner` of the same environment (key True) and of another (False)."""
    tasks, exp_tasks = [t.task_id for t in targets], [{e.task_id for e in exps} for exps in experiences]
    return {same: [partner(i, tasks, envs, exp_tasks, same) for i in range(len(targets))] for same in (True, False)}


def ladder_subset(targets: list[Trajectory], experiences: list[list[Trajectory]], envs: list[str], limit: int,
                  seed: int) -> list[int]:
    """Indices of at most ``limit`` targets (0 = all) that have both partners (:func:`partners`),
    chosen by sha1(seed:trajectory id) and returned in store order."""
    both = partners(targets, experiences, envs)
    ok = [i for i in range(len(targets)) if both[True][i] is not None and both[False][i] is not None]
    order = sorted(ok, key=lambda i: hashlib.sha1(f"{seed}:{targets[i].trajectory_id}".encode()).hexdigest())
    return sorted(order[:limit] if limit else order)


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def token_nll_rows(backbone: nn.Module, batch: LatentBatch, latents_BNd: Tensor, placement: str) -> list[Tensor]:
    """Per row, the teacher's NLL (nats, float32) of each action token, in order, with the latents placed."""
    return logits_nll_rows(latent_teacher_logits(backbone, batch, latents_BNd, placement), batch)


def logits_nll_rows(logits_BTV: Tensor, batch: LatentBatch) -> list[Tensor]:
    """Per row, the NLL (nats, float32) of each action token of ``batch`` under teacher logits aligned with it."""
    lg_BTV, tgt_BT, mask_BT = shift_for_loss(logits_BTV, batch)
    nll_BT = -torch.log_softmax(lg_BTV.float(), dim=-1).gather(-1, tgt_BT.unsqueeze(-1)).squeeze(-1)
    return [nll_BT[b][mask_BT[b]] for b in range(nll_BT.shape[0])]


@dataclass
class LadderInputs:
    """What :func:`evaluate_ladder` scores: held-out targets, their retrieved experiences, those
    of their partners (rungs (d) and (e): :func:`partners`), their tool schemas, the backbone's
    tokenizer, the composer settings (J, token caps, placement) and the batch size."""

    tokenizer: PreTrainedTokenizerBase
    targets: list[Trajectory]
    experiences: list[list[Trajectory]]
    same_env_experiences: list[list[Trajectory]]
    other_env_experiences: list[list[Trajectory]]
    tools: list[list[dict]]
    J: int
    max_exp_tokens: int
    max_len: int | None
    placement: str = "prefix"
    batch_size: int = 2


def evaluate_ladder(composer: Composer, inputs: LadderInputs, *, untrained_phi: list[Tensor] | None,
                    free_prompt: FreePrompt | None, task_only: TaskOnlyControl | None = None,
                    progress: Progress | None = None, rungs: Collection[str] = RUNG_NAMES) -> Ladder:
    """Score ``rungs`` ((a) and (c) always) on ``inputs.targets``; rungs (b), (h) and (h') are left out
    when ``untrained_phi`` / ``free_prompt`` / ``task_only`` is None. The scoring is a task of ``progress``
    when given, advanced after each batch of each rung.

    Raises:
        ValueError: fewer than 2 targets.
    """
    t, n = inputs, len(inputs.targets)
    if n < 2:
        raise ValueError("the ladder needs at least 2 held-out targets")
    backbone = composer.backbone
    device = backbone.get_input_embeddings().weight.device
    own = [[traj, *exps[: t.J - 1]] for traj, exps in zip(t.targets, t.experiences)]
    exps_of = {"c": t.experiences, "d": t.same_env_experiences, "e": t.other_env_experiences, "f": own}

    def batches(exps: list[list[Trajectory]]) -> list[LatentBatch]:
        return [build_batch(t.tokenizer, t.targets[lo:lo + t.batch_size], exps[lo:lo + t.batch_size],
                            J=t.J, max_exp_tokens=t.max_exp_tokens, max_len=t.max_len,
                            tools=t.tools[lo:lo + t.batch_size],
                            framed=get_placement(t.placement).needs_frame_ids).to(device)
                for lo in range(0, n, t.batch_size)]

    left_out = {"b": untrained_phi is None, "h": free_prompt is None, "h'": task_only is None}
    scored = [r for r in RUNGS if not left_out.get(r) and (r in rungs or r in ("a", "c"))]
    task = None if progress is None else progress.add_task(
        f"ladder: scoring {len(scored)} rungs on {n} held-out targets", total=len(scored) * math.ceil(n / t.batch_size))

    def counted(rows_of_batch: list[Tensor]) -> list[Tensor]:
        if task is not None:
            progress.advance(task)
        return rows_of_batch

    rows: dict[str, list[Tensor]] = {}
    was_training = backbone.training
    backbone.eval()
    try:
        with torch.no_grad():
            deployed = batches(t.experiences)
            rows["a"] = [r for bt in deployed for r in counted(token_nll_rows(
                backbone, bt, backbone.get_input_embeddings().weight.new_zeros(bt.input_ids_BT.shape[0], 0,
                                                                               composer.hparams["hidden_size"]),
                "prefix"))]
            untrained = []
            if "b" in scored:
                with swapped_phi(composer, untrained_phi):
                    rows["b"] = []
                    for bt in deployed:
                        c_BNd = composer(bt.exp_ids_BJL, bt.exp_mask_BJL)
                        untrained.append(c_BNd.reshape(-1, composer.K, c_BNd.shape[-1]))
                        rows["b"] += counted(token_nll_rows(backbone, bt, c_BNd, t.placement))
            latents = []
            for rung in (r for r in ("c", "d", "e", "f") if r in scored):
                rows[rung] = []
                for bt in deployed if rung == "c" else batches(exps_of[rung]):
                    c_BNd = composer(bt.exp_ids_BJL, bt.exp_mask_BJL)
                    if rung == "c":
                        latents.append(c_BNd.reshape(-1, composer.K, c_BNd.shape[-1]))
                    rows[rung] += counted(token_nll_rows(backbone, bt, c_BNd, t.placement))
            for rung in (r for r in ("g", "i") if r in scored):
                bts = deployed if rung == "g" else batches(t.other_env_experiences)
                rows[rung] = [r for bt in bts
                              for r in counted(logits_nll_rows(text_teacher_logits(backbone, bt, t.placement), bt))]
            if "h" in scored:
                rows["h"] = [r for bt in deployed for r in counted(token_nll_rows(
                    backbone, bt, free_prompt(bt.exp_ids_BJL, bt.exp_mask_BJL), t.placement))]
            if "h'" in scored:  # no experiences: each composer input row is the task text alone
                rows["h'"] = [r for bt in batches([[] for _ in range(n)]) for r in counted(token_nll_rows(
                    backbone, bt, task_only.composer(bt.exp_ids_BJL, bt.exp_mask_BJL), t.placement))]
            cosine = mean_pairwise_cosine(distinct_rows(torch.cat(latents), deployed))
            cosine_b = mean_pairwise_cosine(distinct_rows(torch.cat(untrained), deployed)) if untrained else None
    finally:
        backbone.train(was_training)
    ladder = ladder_of(rows, [traj.trajectory_id for traj in t.targets], cosine, cosine_b)
    if task_only is None:
        return ladder
    return ladder.model_copy(update={"task_only_lr": task_only.lr, "task_only_sweep": task_only.sweep})


def distinct_rows(latents_NKd: Tensor, batches: list[LatentBatch]) -> Tensor:
    """The latents of distinct composer input rows (a row repeated in the batches counts once).

    Args:
        latents_NKd: (N, K, d) float, one row per composer input row of ``batches`` in order
            (each batch's B x J rows, row-major), N the total.
    Returns:
        (N', K, d): the rows whose unpadded experience ids are first seen, in order.
    """
    keys, keep = set(), []
    rows = ((ids, mask) for bt in batches
            for ids, mask in zip(bt.exp_ids_BJL.flatten(0, 1), bt.exp_mask_BJL.flatten(0, 1)))
    for r, (ids_L, mask_L) in enumerate(rows):
        key = tuple(ids_L[mask_L.bool()].tolist())
        if key not in keys:
            keys.add(key)
            keep.append(r)
    return latents_NKd[keep]


def ladder_of(rows: dict[str, list[Tensor]], target_ids: list[str], latent_cosine: float,
              latent_cosine_untrained: float | None = None) -> Ladder:
    """The :class:`Ladder` of per-rung, per-target token NLL rows (rung "a" required: it marks
    the decisive tokens) and the latent cosines of the trained and untrained composer."""
    decisive = [r > DECISIVE_NATS for r in rows["a"]]
    counts = [int(r.numel()) for r in rows["a"]]
    counts_d = [int(m.sum()) for m in decisive]
    sums = {k: [float(r.sum()) for r in v] for k, v in rows.items()}
    sums_d = {k: [float(r[m].sum()) for r, m in zip(v, decisive)] for k, v in rows.items()}
    tok, tok_d = sum(counts), sum(counts_d)
    diffs = []
    for x, y in COMPARISONS:
        if x in rows and y in rows:
            d, se = pooled_difference(sums[x], sums[y], counts)
            dd, sed = pooled_difference(sums_d[x], sums_d[y], counts_d)
            diffs.append(Difference(x=x, y=y, diff=d, se=se, diff_decisive=dd, se_decisive=sed))
    return Ladder(nll={k: sum(v) / max(tok, 1) for k, v in sums.items()},
                  nll_decisive={k: sum(v) / tok_d if tok_d else math.nan for k, v in sums_d.items()},
                  differences=diffs, latent_cosine=latent_cosine, latent_cosine_untrained=latent_cosine_untrained,
                  targets=len(target_ids), tokens=tok,
                  decisive_tokens=tok_d, target_ids=target_ids, sums=sums, sums_decisive=sums_d, counts=counts,
                  counts_decisive=counts_d)


# ---------------------------------------------------------------------------------------------
# The ladder of a cold-start run
# ---------------------------------------------------------------------------------------------


def run_ladder(composer: Composer, tokenizer: PreTrainedTokenizerBase, data: ColdstartData, train: list[Trajectory],
               heldout: list[Trajectory], config: ColdstartConfig, untrained_phi: list[Tensor] | None, out: Path,
               limit: int | None = None, seed: int | None = None, console: Console | None = None,
               rungs: str | None = None) -> Ladder | None:
    """The ladder of a cold-start run on at most ``limit`` (default ``config.ladder_targets``)
    held-out targets chosen with ``seed`` (default ``config.seed``; :func:`ladder_subset`), its
    ``rungs`` (comma-separated, default ``config.ladder_rungs``; (h) and (h') are trained only when
    scored); None with fewer than 2 targets that have both partners. ``console`` gets a line as each
    phase starts."""
    wanted = rung_list(config.ladder_rungs if rungs is None else rungs)
    exps = data.experiences(heldout, heldout=True)
    envs = environments_of(heldout)
    idx = ladder_subset(heldout, exps, envs, config.ladder_targets if limit is None else limit,
                        config.seed if seed is None else seed)
    if len(idx) < 2:
        return None
    targets, both = [heldout[i] for i in idx], partners(heldout, exps, envs)
    inputs = LadderInputs(tokenizer=tokenizer, targets=targets, experiences=[exps[i] for i in idx],
                          same_env_experiences=[exps[both[True][i]] for i in idx],
                          other_env_experiences=[exps[both[False][i]] for i in idx], tools=data.tools(targets),
                          J=config.J,
                          max_exp_tokens=config.max_exp_tokens, max_len=config.max_len, placement=config.placement,
                          batch_size=config.batch_size)
    shared = composer.hparams["qformer_shared"]
    for rung, name, reuse in (("(h)", FREE_PROMPT, kept(out, config, train) if "h" in wanted else None),
                              ("(h')", TASK_ONLY, task_only_kept(out, config, train, shared) if "h'" in wanted else None)):
        if console is not None and reuse is not None:
            console.print(f"ladder: the control {rung}, read from {name}" if reuse else
                          f"ladder: {name} was trained from other settings or targets: {rung} is trained again")
    with StageProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=console, transient=True, disable=console is None) as bar:
        free = free_prompt_of(composer, data, train, config, out, progress=bar) if "h" in wanted else None
        with (task_only_of(composer, data, train, config, out, progress=bar) if "h'" in wanted
              else contextlib.nullcontext()) as task_only:
            return evaluate_ladder(composer, inputs, untrained_phi=untrained_phi, free_prompt=free,
                                   task_only=task_only, progress=bar, rungs=wanted)


# how to read a ladder: the criteria its differences are judged by
READING = ("A negative difference favours the first rung. Latents carry content when, on decisive tokens, (c) is below "
           "(e) and below (h') (which reads the task text, not the experiences) by at least 3 paired SE; the channel's "
           "capacity is shown when (f) is at most half of (a).")


def print_ladder(console: Console, ladder: Ladder, title: str = "composer ladder (held-out teacher NLL)") -> None:
    """The ladder as a table: per rung the pooled NLL on all and on decisive tokens; then the
    differences; the criteria (:data:`READING`) as its caption; below it the lr of (h')."""
    table = titled_table(f"{title}: {ladder.targets} targets, {ladder.tokens} action tokens, "
                        f"{ladder.decisive_tokens} decisive (> {DECISIVE_NATS:g} nat without latents)",
                  caption=READING)
    for col in ("rung", "context", "NLL", "NLL decisive"):
        table.add_column(col, justify="left" if col in ("rung", "context") else "right")
    for k, label in RUNGS.items():
        if k in ladder.nll:
            table.add_row(f"({k})", label, f"{ladder.nll[k]:.4f}", f"{ladder.nll_decisive[k]:.3f}")
    for d in ladder.differences:
        table.add_row("", f"({d.x}) - ({d.y}), paired", f"{d.diff:+.4f} ± {d.se:.4f}",
                      f"{d.diff_decisive:+.3f} ± {d.se_decisive:.3f}")
    table.add_row("", "latent cosine, different experiences", f"{ladder.latent_cosine:.3f}", "")
    if ladder.latent_cosine_untrained is not None:
        table.add_row("", "the same, untrained composer", f"{ladder.latent_cosine_untrained:.3f}", "")
    console.print(table)
    if ladder.task_only_lr is not None:
        console.print(task_only_line(ladder))


def ladder_markdown(ladder: Ladder) -> list[str]:
    """The ladder as markdown lines: a table of the rungs, then the paired differences and the latent cosine."""
    lines = [f"Composer ladder: {ladder.targets} held-out targets, {ladder.tokens} action tokens, "
             f"{ladder.decisive_tokens} decisive (> {DECISIVE_NATS:g} nat without latents).", "",
             "| rung | context | NLL (nats/token) | NLL, decisive tokens |", "|---|---|---|---|"]
    lines += [f"| ({k}) | {label} | {ladder.nll[k]:.4f} | {ladder.nll_decisive[k]:.3f} |"
              for k, label in RUNGS.items() if k in ladder.nll]
    lines += ["", "| paired over targets | all tokens | decisive tokens |", "|---|---|---|"]
    lines += [f"| ({d.x}) - ({d.y}) | {d.diff:+.4f} ± {d.se:.4f} | {d.diff_decisive:+.3f} ± {d.se_decisive:.3f} |"
              for d in ladder.differences]
    untrained = ("" if ladder.latent_cosine_untrained is None
                 else f" (untrained composer: {ladder.latent_cosine_untrained:.3f})")
    lines += ["", f"Latent cosine between different experiences: {ladder.latent_cosine:.3f}{untrained}."]
    lines += [] if ladder.task_only_lr is None else ["", task_only_line(ladder) + "."]
    return lines + ["", READING, ""]


def task_only_line(ladder: Ladder) -> str:
    """The task-only composer's (h') learning rate and the sweep that chose it, as one line."""
    sweep = ", ".join(f"{lr}: {nll:.4f}" for lr, nll in (ladder.task_only_sweep or {}).items())
    how = f"chosen on training tasks (validation NLL {sweep})" if sweep else "the run's (no validation tasks)"
    return f"(h') learning rate {ladder.task_only_lr:g}, {how}"


def heldout_of(ladder: Ladder) -> HeldoutResult:
    """The cold start's four-way held-out result read off the ladder: (a) no latents, (b) untrained,
    (c) trained, (d) another task's experiences (here of the same environment), on the ladder's targets."""
    return HeldoutResult(nll_no_latents=ladder.nll["a"], nll_untrained=ladder.nll.get("b"), nll_trained=ladder.nll["c"],
                         nll_other_experiences=ladder.nll.get("d"), trajectories=ladder.targets, tokens=ladder.tokens)
