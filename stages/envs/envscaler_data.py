"""EnvScaler data: the environments and tasks tables, read and split (:mod:`.envscaler` plays them).

Data (the EnvScaler release's format): an environments table {env_id, env_class_code,
env_class_name, tools, environment_introduction, constraints_rules} and a tasks table {task_id,
env_id, init_config, task, checklist_with_func: [{check_item, check_func}]}. ``tools``,
``init_config`` and ``checklist_with_func`` may be parsed values or JSON strings (the public
release stores strings). Sources, first match wins:

- ``envs_file=`` / ``tasks_file=``: explicit JSON (list, or dict keyed by id) / JSONL files;
- ``data_dir``: a folder holding one ``*env*.json[l]`` file and one ``*task*``/``*scen*`` file;
- ``hf_dataset=`` (or a ``data_dir`` that is no local folder but looks like ``owner/name``): a
  Hugging Face dataset id or local dataset path of the tasks (scenarios), e.g. :data:`HF_TASKS`,
  loaded with ``datasets.load_dataset``; environments come from the same rows when they carry
  ``env_class_code``, otherwise from ``hf_envs=`` (default :data:`HF_ENVS`);
- nothing: the bundled fixtures in ``examples/envscaler_fixtures/`` (logged).

Split: task ids are sorted, shuffled with ``random.Random(seed)`` and the first ``n_test`` form the
``test`` split, the rest ``train`` (disjoint, deterministic). ``n_test = test_size`` (default 200)
when there are at least ``2 * test_size`` tasks, otherwise 20% of them (at least 1, and at most
all but one when there are two or more). Seed and ``n_test`` are recorded in ``Task.metadata``.
Data whose task rows all carry a ``split`` field (a lopd extension, e.g. the study bed's
``train`` / ``test`` / ``transfer`` / ``warmup``) keeps those splits; each is ordered the same
seeded way. Task rows may also carry ``reference_actions`` (a lopd extension: the correct tool
calls ``[{"name", "arguments"}]`` in order), which :meth:`EnvScalerEnv.reference_actions` plays.
A task row carrying ``user_system_prompt`` is conversational (:mod:`.envscaler_conv`).
A data folder holding a ``bed.json`` with a ``label`` is named by that label in every report.
"""
from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from schemas import ToolCall
from stages.core.data.inputs import hub_dataset_id, read_utf8
from stages.envs.base import AGENTIC_RULES, EnvError

log = logging.getLogger(__name__)

FIXTURES_DIR = Path(__file__).resolve().parents[2] / "examples" / "envscaler_fixtures"
HF_ENVS = "XXHStudyHard/EnvScaler-191-Env"
HF_TASKS = "XXHStudyHard/EnvScaler-RL-Scenario"
TOOL_CALL_NOTE = (
    "## How to act\n"
    "Use the tools to complete the user's task. Call a tool by writing\n"
    '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>\n'
    "Each result comes back in a tool message. " + AGENTIC_RULES
)


@dataclass(frozen=True)
class EnvSpec:
    """One environment class: source, tools and the text shown to the agent."""

    env_id: str
    class_name: str
    code: str
    tools: tuple[dict[str, Any], ...]
    introduction: str
    rules: tuple[str, ...]

    @property
    def tool_names(self) -> list[str]:
        """Names of the offered tools."""
        return [t["function"]["name"] for t in self.tools]

    def system_prompt(self) -> str:
        """Environment introduction + constraints + the tool-call format note."""
        rules = "\n".join(f"- {r}" for r in self.rules) or "- (none)"
        return (
            f"# Environment Information\n\n## Brief Introduction\n{self.introduction}\n\n"
            f"## Environment Rules / Constraints\n{rules}\n\n{TOOL_CALL_NOTE}"
        )


@dataclass(frozen=True)
class TaskSpec:
    """One scenario: initial state, task text and check functions."""

    task_id: str
    env_id: str
    class_name: str
    init_config: dict[str, Any]
    text: str
    checks: tuple[tuple[str, str], ...]  # (check_item, check_func source)
    split: str | None = None  # the row's own split (lopd extension), else None
    reference: tuple[ToolCall, ...] | None = None  # the row's reference_actions (lopd extension)
    user_prompt: str | None = None  # the row's user_system_prompt: a conversational task (see .envscaler_conv)


@dataclass(frozen=True)
class EnvScalerData:
    """Loaded, validated data and its split."""

    source: str
    envs: dict[str, EnvSpec]
    tasks: dict[str, TaskSpec]
    splits: dict[str, tuple[str, ...]]
    seed: int


# ----------------------------------------------------------------------------- loading


def _json_value(value: Any, where: str, field: str, kind: type) -> Any:
    if isinstance(value, str) and kind in (list, dict):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise EnvError(f"{where}: field {field!r} is not valid JSON ({err.msg})") from None
    if not isinstance(value, kind):
        raise EnvError(f"{where}: field {field!r} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _required(row: dict[str, Any], field: str, where: str, kind: type = str) -> Any:
    if field not in row or row[field] is None:
        raise EnvError(f"{where}: missing field {field!r}")
    return _json_value(row[field], where, field, kind)


def _tool_schema(tool: Any, where: str) -> dict[str, Any]:
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise EnvError(f"{where}: field 'tools' holds an entry without a function name")
    return {"type": "function", "function": fn}


def _env_spec(row: dict[str, Any], where: str) -> EnvSpec:
    rules = row.get("constraints_rules") or []
    if isinstance(rules, str):
        rules = [line.lstrip("- ").strip() for line in rules.splitlines() if line.strip()]
    tools = _required(row, "tools", where, list)
    return EnvSpec(
        env_id=str(_required(row, "env_id", where, object)),
        class_name=_required(row, "env_class_name", where),
        code=_required(row, "env_class_code", where),
        tools=tuple(_tool_schema(t, where) for t in tools),
        introduction=str(row.get("environment_introduction") or ""),
        rules=tuple(str(r) for r in _json_value(rules, where, "constraints_rules", list)),
    )


def _task_spec(row: dict[str, Any], where: str, envs: dict[str, EnvSpec]) -> TaskSpec:
    task_id = str(_required(row, "task_id", where, object))
    where = f"{where} (task {task_id})"
    env_id = str(_required(row, "env_id", where, object))
    if env_id not in envs:
        raise EnvError(f"{where}: field 'env_id' = {env_id!r} names no loaded environment")
    checks = []
    for item in _required(row, "checklist_with_func", where, list):
        if not isinstance(item, dict) or not isinstance(item.get("check_func"), str):
            raise EnvError(f"{where}: field 'checklist_with_func' holds an entry without a check_func string")
        checks.append((str(item.get("check_item", "")), item["check_func"]))
    split = row.get("split")
    if split is not None and (not isinstance(split, str) or not split.strip()):
        raise EnvError(f"{where}: field 'split' must be a non-empty string, got {split!r}")
    return TaskSpec(
        task_id=task_id,
        env_id=env_id,
        class_name=str(row.get("env_class_name") or envs[env_id].class_name),
        init_config=_required(row, "init_config", where, dict),
        text=_required(row, "task", where),
        checks=tuple(checks),
        split=split,
        reference=_reference(row, where),
        user_prompt=_user_prompt(row, where),
    )


def _user_prompt(row: dict[str, Any], where: str) -> str | None:
    """The row's ``user_system_prompt`` (None when the row has none): the simulated user's system
    prompt, ``{task}`` in it replaced by the task text (the template of EnvScaler's
    ``envscaler_env/utils/user_agent.py`` is formatted with the task the same way)."""
    prompt = row.get("user_system_prompt")
    if prompt is None:
        return None
    if not isinstance(prompt, str) or not prompt.strip():
        raise EnvError(f"{where}: field 'user_system_prompt' must be a non-empty string")
    return prompt.replace("{task}", str(row["task"]))


def _reference(row: dict[str, Any], where: str) -> tuple[ToolCall, ...] | None:
    """The row's ``reference_actions`` as tool calls (None when the row has none)."""
    if row.get("reference_actions") is None:
        return None
    calls = []
    for call in _json_value(row["reference_actions"], where, "reference_actions", list):
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("arguments"), dict)):
            raise EnvError(f"{where}: field 'reference_actions' holds an entry that is not "
                           '{"name": str, "arguments": object}')
        calls.append(ToolCall(name=call["name"], arguments=json.dumps(call["arguments"], ensure_ascii=False)))
    return tuple(calls)


def _read_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Rows of a JSON (list, or dict keyed by id) or JSONL file, each with its location."""
    text = read_utf8(path, EnvError)
    try:
        if path.suffix == ".jsonl":
            data: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
    except json.JSONDecodeError as err:
        raise EnvError(f"{path}: invalid JSON at line {err.lineno} ({err.msg})") from None
    if isinstance(data, dict):
        data = list(data.values())
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise EnvError(f"{path}: expected a list of objects (or a dict of objects keyed by id)")
    return [(f"{path}: row {i}", r) for i, r in enumerate(data)]


def _find_file(folder: Path, kind: str) -> Path:
    files = sorted(p for p in folder.iterdir() if p.suffix in (".json", ".jsonl") and p.is_file())
    is_task = [p for p in files if "task" in p.name.lower() or "scen" in p.name.lower()]
    hits = is_task if kind == "tasks" else [p for p in files if "env" in p.name.lower() and p not in is_task]
    if len(hits) != 1:
        found = ", ".join(p.name for p in hits) or "none"
        raise EnvError(f"{folder}: need exactly one {kind} file (*{'task' if kind == 'tasks' else 'env'}*.json[l]); found {found}")
    return hits[0]


def _hf_rows(name: str, split: str) -> list[tuple[str, dict[str, Any]]]:
    import datasets

    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as err:  # network, missing dataset, bad split: all reported the same way
        raise EnvError(f"hf dataset {name!r}: cannot load split {split!r} ({type(err).__name__}: {err})") from None
    return [(f"hf dataset {name!r}: row {i}", dict(r)) for i, r in enumerate(ds)]


def _split(task_ids: list[str], test_size: int, seed: int) -> dict[str, tuple[str, ...]]:
    ids = _seeded_order(task_ids, seed)
    n = len(ids)
    n_test = test_size if n >= 2 * test_size else max(1, round(0.2 * n))
    n_test = min(n_test, n - 1) if n >= 2 else n
    return {"test": tuple(ids[:n_test]), "train": tuple(ids[n_test:])}


def _seeded_order(task_ids: list[str], seed: int) -> list[str]:
    ids = sorted(task_ids)
    random.Random(seed).shuffle(ids)
    return ids


def _own_splits(tasks: dict[str, TaskSpec], seed: int) -> dict[str, tuple[str, ...]]:
    """Splits named by the task rows themselves, each in the seeded order."""
    by_split: dict[str, list[str]] = {}
    for tid, spec in tasks.items():
        by_split.setdefault(spec.split, []).append(tid)
    return {name: tuple(_seeded_order(ids, seed)) for name, ids in sorted(by_split.items())}


def _build(source: str, env_rows: list, task_rows: list, test_size: int, seed: int) -> EnvScalerData:
    from stages.core.text.toolcalls import unknown_schema_types

    envs: dict[str, EnvSpec] = {}
    unknown_types = []
    for where, row in env_rows:
        spec = _env_spec(row, where)
        envs[spec.env_id] = spec
        unknown_types += [f"{where}: env {spec.env_id}, tool {t['function']['name']!r}, parameter {p}"
                          for t in spec.tools for p in unknown_schema_types(t["function"].get("parameters"))]
    if unknown_types:  # once per load: the model sees these schemas as given
        more = f" (and {len(unknown_types) - 5} more)" if len(unknown_types) > 5 else ""
        log.warning("envscaler: unknown JSON-schema type(s) in the tools of %s: %s%s", source, "; ".join(unknown_types[:5]), more)
    tasks: dict[str, TaskSpec] = {}
    skipped = 0
    for where, row in task_rows:
        spec = _task_spec(row, where, envs)
        if spec.task_id in tasks:
            raise EnvError(f"{where}: field 'task_id' = {spec.task_id!r} is duplicated")
        if not spec.checks:
            skipped += 1
            continue
        tasks[spec.task_id] = spec
    if skipped:
        log.warning("envscaler: skipped %d task(s) with an empty checklist_with_func in %s", skipped, source)
    if not tasks:
        raise EnvError(f"{source}: no usable tasks")
    with_split = sum(spec.split is not None for spec in tasks.values())
    if with_split not in (0, len(tasks)):
        raise EnvError(f"{source}: field 'split' is set on {with_split} of {len(tasks)} tasks; set it on all or none")
    splits = _own_splits(tasks, seed) if with_split else _split(list(tasks), test_size, seed)
    return EnvScalerData(source, envs, tasks, splits, seed)


@lru_cache(maxsize=4)
def _load_files(envs_file: Path, tasks_file: Path, stamp: tuple[float, float], test_size: int, seed: int) -> EnvScalerData:
    if envs_file.parent == FIXTURES_DIR:
        log.info("envscaler: no data_dir or hf_dataset given; using the bundled fixtures in %s", FIXTURES_DIR)
    source = f"{envs_file} + {tasks_file}"
    label = _bed_label(envs_file.parent / "bed.json")
    return _build(f"{label}: {source}" if label else source, _read_rows(envs_file), _read_rows(tasks_file),
                  test_size, seed)


def _bed_label(path: Path) -> str | None:
    """The ``label`` of a data folder's ``bed.json`` (None without one).

    Raises:
        EnvError: a bed.json that is not a JSON object with a string ``label``.
    """
    if not path.is_file():
        return None
    try:
        label = json.loads(read_utf8(path, EnvError)).get("label")
    except (json.JSONDecodeError, AttributeError):
        label = None
    if not isinstance(label, str) or not label:
        raise EnvError(f"{path}: field 'label' must be a non-empty string (a JSON object holding it)")
    return label


@lru_cache(maxsize=4)
def _load_hf(hf_dataset: str, hf_envs: str, hf_split: str, test_size: int, seed: int) -> EnvScalerData:
    task_rows = _hf_rows(hf_dataset, hf_split)
    inline = bool(task_rows) and "env_class_code" in task_rows[0][1]
    env_rows = task_rows if inline else _hf_rows(hf_envs, hf_split)
    return _build(f"hf dataset {hf_dataset!r}", env_rows, task_rows, test_size, seed)


def load_data(
    data_dir: Path | str | None = None,
    envs_file: Path | str | None = None,
    tasks_file: Path | str | None = None,
    hf_dataset: str | None = None,
    hf_envs: str = HF_ENVS,
    hf_split: str = "train",
    test_size: int = 200,
    seed: int = 0,
) -> EnvScalerData:
    """Load and validate EnvScaler data (cached per source; see the module docstring for sources).

    Raises:
        EnvError: missing/ambiguous files, malformed rows (message names file/row and field),
            an unreachable HF dataset, or no usable task.
    """
    if test_size < 1:
        raise EnvError(f"envscaler: test_size must be >= 1, got {test_size}")
    if data_dir is not None and not Path(data_dir).exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", str(data_dir)):
        # one quick hub lookup: a mistyped relative folder fails at once, not after loader retries
        hf_dataset, data_dir = hf_dataset or hub_dataset_id(str(data_dir), error=EnvError), None
    if hf_dataset:
        if data_dir is not None or envs_file or tasks_file:
            raise EnvError("envscaler: give either hf_dataset or local files (data_dir / envs_file / tasks_file), not both")
        return _load_hf(hf_dataset, hf_envs, hf_split, test_size, seed)
    if data_dir is None and not (envs_file or tasks_file):
        if not FIXTURES_DIR.is_dir():
            raise EnvError(f"envscaler: bundled fixtures not found at {FIXTURES_DIR}; pass data_dir or hf_dataset")
        data_dir = FIXTURES_DIR
    folder = Path(data_dir) if data_dir is not None else None
    if folder is None and not (envs_file and tasks_file):
        raise EnvError("envscaler: envs_file and tasks_file go together (or give data_dir to find the other)")
    if folder is not None and not folder.is_dir():
        raise EnvError(f"{folder}: data_dir is not a folder")
    env_path = Path(envs_file) if envs_file else _find_file(folder, "environments")
    task_path = Path(tasks_file) if tasks_file else _find_file(folder, "tasks")
    for p in (env_path, task_path):
        if not p.is_file():
            raise EnvError(f"{p}: file not found")
    stamp = (env_path.stat().st_mtime, task_path.stat().st_mtime)
    return _load_files(env_path.resolve(), task_path.resolve(), stamp, test_size, seed)
