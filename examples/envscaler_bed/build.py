"""Regenerate the lopd study bed: ``environments.jsonl``, ``tasks.jsonl`` and the counts in ``bed.json``.

    python examples/envscaler_bed/build.py [--skip-broken] [--domains DIR]

Every module or package in ``domains/`` (sorted by name; those named ``_*``, the builders and
draws they share, aside) defines ``ENVS``; each environment's tasks come from its
``make_task(random.Random(f"{env_id}:{seed}"))`` for seed = 0, 1, 2, ... (a task whose text repeats
an earlier one of the same environment is skipped), so the output is the same on every run.
Tasks per role (:data:`SPLITS_BY_ROLE`): main 40 "train", 15 "test" and 10 "test_values";
transfer 34 "transfer"; warmup 40 "warmup".

Held out by phrasing: a task's phrasing is its text with its environment's values masked
(:func:`phrasing`), its kind the tool names of its reference actions. Per main environment the
phrasings of one whole kind and one phrasing of every other kind that has several are held out
(:func:`held_out_phrasings`): "test" tasks use only those; "train", "test_values" and "warmup"
never do, and every "test_values" task (new values) uses a phrasing of its environment's train
tasks. In every split of every environment at least :data:`MULTI_SHARE` of the tasks have two or
more checks.

A module that fails to import or breaks the contract is reported with its file and field;
nothing is written unless ``--skip-broken`` is given (then the report lists the modules left
out). Stdlib only.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import random
import re
import sys
from pathlib import Path
from typing import Any

BED_DIR = Path(__file__).resolve().parent
DOMAINS_DIR = BED_DIR / "domains"
if str(BED_DIR) not in sys.path:  # the domain modules import their shared builders as `domains._common`
    sys.path.insert(0, str(BED_DIR))
SPLITS_BY_ROLE = {"main": (("train", 40), ("test", 15), ("test_values", 10)), "transfer": (("transfer", 34),),
                  "warmup": (("warmup", 40),)}
HELD_OUT_SPLIT = "test"  # the split of held-out phrasings (main environments)
VALUES_SPLIT = "test_values"  # held-out values in phrasings of the environment's train tasks
MULTI_SHARE = 0.4  # least share of tasks with two or more checks, per environment and split
ENUMERATE_SEEDS = 400  # seeds drawn per main environment to find its kinds and phrasings
ENV_FIELDS = ("env_id", "env_class_name", "role", "environment_introduction", "constraints_rules", "tools",
              "env_class_code", "make_task")
TASK_FIELDS = ("init_config", "task", "checklist_with_func", "reference_actions")
MAX_TRIES_PER_TASK = 20  # seeds tried per wanted task before a generator is called too repetitive
BED_META = {"name": "lopd-bed", "version": 2,
            "label": "lopd study bed (lopd's own environments in the EnvScaler format; not the EnvScaler release)"}


class BedError(Exception):
    """A domain module that breaks the contract; the message names the file and field."""


def load_domain(path: Path, where: str) -> list[dict[str, Any]]:
    """The ``ENVS`` list of one domain module (a ``.py`` file, or a package folder whose modules
    import each other relatively), checked against the contract (no task generated yet); ``where``
    names the module in messages.

    Raises:
        BedError: the module fails to import, has no ``ENVS`` list, or an environment lacks a field,
            has a wrong role, or its ``env_class_code`` does not define ``env_class_name``.
    """
    try:
        name = f"lopd_bed_domain_{path.stem}"
        if path.is_dir():
            spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                          submodule_search_locations=[str(path)])
            for stale in [m for m in sys.modules if m.startswith(f"{name}.")]:  # submodules of a package of
                del sys.modules[stale]  # this name loaded before, maybe from another folder: reload them
        else:
            spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and pickling look their module up there
        spec.loader.exec_module(module)
    except Exception as err:  # any import-time failure of a domain module is reported the same way
        raise BedError(f"{where}: import failed ({type(err).__name__}: {err})") from None
    envs = getattr(module, "ENVS", None)
    if not isinstance(envs, list) or not envs:
        raise BedError(f"{where}: field 'ENVS' must be a non-empty list")
    for env in envs:
        env_where = f"{where}: env {env.get('env_id')!r}" if isinstance(env, dict) else where
        if not isinstance(env, dict):
            raise BedError(f"{where}: field 'ENVS' holds a {type(env).__name__}, not a dict")
        missing = [f for f in ENV_FIELDS if f not in env]
        if missing:
            raise BedError(f"{env_where}: missing field {missing[0]!r}")
        if env["role"] not in SPLITS_BY_ROLE:
            raise BedError(f"{env_where}: field 'role' = {env['role']!r}; use one of {', '.join(SPLITS_BY_ROLE)}")
        namespace: dict[str, Any] = {}
        try:
            exec(compile(env["env_class_code"], f"<{env['env_id']}>", "exec"), namespace)
        except Exception as err:  # the class source is data; any failure is a contract break
            raise BedError(f"{env_where}: field 'env_class_code' does not run ({type(err).__name__}: {err})") from None
        if not isinstance(namespace.get(env["env_class_name"]), type):
            raise BedError(f"{env_where}: field 'env_class_code' defines no class {env['env_class_name']!r}")
    return envs


def check_task(env: dict[str, Any], task: Any, where: str) -> None:
    """Structural checks of one ``make_task`` result (behaviour is check.py's job).

    Raises:
        BedError: a missing field, an empty checklist, or a reference action naming an unknown tool
            or arguments that the tool's schema does not allow or require.
    """
    if not isinstance(task, dict):
        raise BedError(f"{where}: make_task returned a {type(task).__name__}, not a dict")
    for field in TASK_FIELDS:
        if field not in task:
            raise BedError(f"{where}: missing field {field!r}")
    if not isinstance(task["task"], str) or not task["task"].strip():
        raise BedError(f"{where}: field 'task' must be a non-empty string")
    checks = task["checklist_with_func"]
    if not isinstance(checks, list) or not checks or not all(
            isinstance(c, dict) and isinstance(c.get("check_func"), str) for c in checks):
        raise BedError(f"{where}: field 'checklist_with_func' must be a non-empty list of {{check_item, check_func}}")
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in env["tools"]}
    actions = task["reference_actions"]
    if not isinstance(actions, list) or not actions:
        raise BedError(f"{where}: field 'reference_actions' must be a non-empty list")
    for action in actions:
        name = action.get("name") if isinstance(action, dict) else None
        if name not in schemas or not isinstance(action.get("arguments"), dict):
            raise BedError(f"{where}: field 'reference_actions' holds {action!r}: no tool of that name with arguments")
        allowed = set(schemas[name].get("properties") or {})
        required = set(schemas[name].get("required") or [])
        given = set(action["arguments"])
        if not required <= given <= allowed:
            raise BedError(f"{where}: field 'reference_actions': {name} called with {sorted(given)}, "
                           f"schema allows {sorted(allowed)} and requires {sorted(required)}")


_DAYS = re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?:day|sday|nesday|rsday|urday)?\b")


def _strings(value: Any, out: set[str]) -> set[str]:
    """Every string value (not dict keys) of a JSON-like value, added to ``out``."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            _strings(item, out)
    elif isinstance(value, str) and len(value.strip()) >= 2:
        out.add(value)
    return out


def vocabulary(tasks: list[dict[str, Any]]) -> set[str]:
    """The values :func:`phrasing` masks for an environment: every string value of the initial
    states and reference arguments of ``tasks`` (one environment's tasks)."""
    out: set[str] = set()
    for task in tasks:
        _strings(task["init_config"], out)
        _strings([a["arguments"] for a in task["reference_actions"]], out)
    return out


def phrasing(text: str, values: set[str]) -> str:
    """The phrasing of a task text: the text with the values of its environment masked as ``_``,
    lower-cased, plural ``s`` dropped. Masked: quoted text, every string of ``values`` (see
    :func:`vocabulary`; longest first, whole words), every token with a digit, day names; a masked
    time ("_ at _", "_ on _", "_ _") is one ``_``. Two tasks of one environment that differ only in
    ids, names, numbers and times have the same phrasing."""
    masked = re.sub(r"'[^']*'", "_", text)
    if values:
        masked = re.sub(r"(?<!\w)(?:" + "|".join(map(re.escape, sorted(values, key=len, reverse=True)))
                        + r")(?!\w)", "_", masked)
    masked = _DAYS.sub("_", re.sub(r"[\w:.-]*\d(?:[\w:-]|\.\d)*", "_", masked))
    masked = re.sub(r"_(?: (?:at|on))? _", "_", re.sub(r"_(?: (?:at|on))? _", "_", masked))
    return " ".join(re.sub(r"(\w{3,})s\b", r"\1", w) for w in masked.lower().split())


def kind(task: dict[str, Any]) -> tuple[str, ...]:
    """A task's kind: the sorted tool names of its reference actions."""
    return tuple(sorted(a["name"] for a in task["reference_actions"]))


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _draw(env: dict[str, Any], seed: int, where: str) -> dict[str, Any]:
    """``make_task`` of one seed, checked (:func:`check_task`).

    Raises:
        BedError: ``make_task`` raised or returned a malformed task.
    """
    task_where = f"{where}, seed {seed}"
    try:
        task = env["make_task"](random.Random(f"{env['env_id']}:{seed}"))
    except Exception as err:  # a generator bug is reported with its env and seed
        raise BedError(f"{task_where}: make_task raised {type(err).__name__}: {err}") from None
    check_task(env, task, task_where)
    return task


def held_out_phrasings(env: dict[str, Any], where: str) -> tuple[set[str], set[str]]:
    """The phrasings a main environment holds out and the vocabulary they are masked with (both
    from the tasks of seeds 0 .. ENUMERATE_SEEDS - 1): every phrasing of one whole kind, and of
    every other kind with two or more phrasings the one with the smallest digest. The whole kind
    (smallest digest) is one whose tasks have two or more checks where the environment has two
    such kinds, else one of two or more calls and one check (else any other). Digests are sha256 of (env id, kind or phrasing)."""
    phrasings: dict[tuple[str, ...], set[str]] = {}
    multi: set[tuple[str, ...]] = set()
    tasks = [_draw(env, seed, where) for seed in range(ENUMERATE_SEEDS)]
    values = vocabulary(tasks)
    for task in tasks:
        phrasings.setdefault(kind(task), set()).add(phrasing(task["task"], values))
        if len(task["checklist_with_func"]) >= 2:
            multi.add(kind(task))
    if len(multi) >= 2:  # one multi-change kind stays in train
        pool = multi
    else:
        pool = {k for k in phrasings if len(k) >= 2 and k not in multi} or set(phrasings) - multi or set(phrasings)
    whole = min(pool, key=lambda k: _digest(env["env_id"], k))
    held = set(phrasings[whole])
    for k, ps in phrasings.items():
        if k != whole and len(ps) >= 2:
            held.add(min(ps, key=lambda p: _digest(env["env_id"], p)))
    return held, values


def env_tasks(env: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The task rows of one environment (see the module docstring for seeds, splits and ids).

    Raises:
        BedError: ``make_task`` raised, returned a malformed task (:func:`check_task`), or did not
            give enough distinct tasks of each split (and of two or more checks) within the seeds tried.
    """
    want = dict(SPLITS_BY_ROLE[env["role"]])
    held, values = held_out_phrasings(env, where) if env["role"] == "main" else (set(), set())
    rows, texts, seed, train_phrasings = [], set(), 0, set()
    filled = {split: [0, 0] for split in want}  # tasks, tasks with one check
    while any(n < want[s] for s, (n, _) in filled.items()):
        if seed >= MAX_TRIES_PER_TASK * sum(want.values()):
            raise BedError(f"{where}: only {({s: n for s, (n, _) in filled.items()})} tasks after {seed} seeds "
                           f"(need {want}, {MULTI_SHARE:.0%} with two or more checks)")
        task = _draw(env, seed, where)
        seed += 1
        if task["task"] in texts:
            continue
        said = phrasing(task["task"], values)
        eligible = [HELD_OUT_SPLIT] if said in held else [s for s in want if s != HELD_OUT_SPLIT]
        single = len(task["checklist_with_func"]) == 1
        for split in eligible:
            n, n_single = filled[split]
            if split == VALUES_SPLIT and said not in train_phrasings:
                continue
            if n < want[split] and not (single and n_single >= want[split] - math.ceil(MULTI_SHARE * want[split])):
                filled[split] = [n + 1, n_single + single]
                if split == "train":
                    train_phrasings.add(said)
                texts.add(task["task"])
                rows.append({"task_id": f"{env['env_id']}-{len(rows):03d}", "env_id": env["env_id"],
                             "env_class_name": env["env_class_name"], "split": split,
                             **{field: task[field] for field in TASK_FIELDS}})
                break
    return rows


def split_digest(task_ids: list[str]) -> str:
    """sha256 (first 16 hex digits) of the sorted task ids of one split, one per line."""
    return hashlib.sha256("\n".join(sorted(task_ids)).encode()).hexdigest()[:16]


def domain_paths(domains_dir: Path) -> list[Path]:
    """The domain modules of ``domains_dir`` in build order (by name): ``*.py`` files and folders with an
    ``__init__.py``, those whose name starts with ``_`` (shared builders, ``__pycache__``) aside."""
    return sorted((p for p in domains_dir.iterdir() if not p.name.startswith("_")
                   and ((p.is_file() and p.suffix == ".py") or (p / "__init__.py").is_file())), key=lambda p: p.stem)


def build(domains_dir: Path = DOMAINS_DIR, skip_broken: bool = False) -> tuple[list, list, dict, list[str]]:
    """Environment rows, task rows, bed.json content and the problems found (one line each).

    With ``skip_broken`` a broken module is left out and reported; otherwise any problem leaves the
    rows empty. Environment ids must be unique across modules.
    """
    env_rows, task_rows, problems, seen = [], [], [], {}
    for path in domain_paths(domains_dir):
        try:
            envs = load_domain(path, f"{domains_dir.name}/{path.name}")
            rows = []
            for env in envs:
                where = f"{domains_dir.name}/{path.name}: env {env['env_id']!r}"
                if env["env_id"] in seen:
                    raise BedError(f"{where}: field 'env_id' is also defined in {seen[env['env_id']]}")
                rows.append(({k: env[k] for k in ENV_FIELDS if k != "make_task"}, env_tasks(env, where)))
        except BedError as err:
            problems.append(str(err))
            continue
        for env_row, tasks in rows:
            seen[env_row["env_id"]] = path.name
            env_rows.append(env_row)
            task_rows.extend(tasks)
    if problems and not skip_broken:
        return [], [], {}, problems
    by_split: dict[str, list[str]] = {}
    for row in task_rows:
        by_split.setdefault(row["split"], []).append(row["task_id"])
    roles: dict[str, int] = {}
    for row in env_rows:
        roles[row["role"]] = roles.get(row["role"], 0) + 1
    meta = dict(BED_META, counts={"environments": dict(sorted(roles.items())),
                                  "tasks": {s: len(ids) for s, ids in sorted(by_split.items())}},
                split_digests={s: split_digest(ids) for s, ids in sorted(by_split.items())})
    return env_rows, task_rows, meta, problems


def jsonl(rows: list[dict[str, Any]]) -> str:
    """One JSON object per line, top-level keys sorted; nested objects keep the order make_task gave them
    (reference arguments stay in the tools' parameter order, as a model should write them)."""
    return "".join(json.dumps(dict(sorted(r.items())), ensure_ascii=False) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    """Build and write the bed; returns the exit status (1 when a module is broken and not skipped, or
    no module defines an environment: then nothing is written)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-broken", action="store_true", help="write the bed without the broken modules")
    parser.add_argument("--domains", type=Path, default=DOMAINS_DIR,
                        help="folder of the domain modules (default: domains/ next to this file)")
    args = parser.parse_args(argv)
    env_rows, task_rows, meta, problems = build(args.domains, skip_broken=args.skip_broken)
    for line in problems:
        print(f"BROKEN {line}", file=sys.stderr)
    if problems and not args.skip_broken:
        print(f"{len(problems)} broken domain module(s); nothing written (--skip-broken writes the rest)", file=sys.stderr)
        return 1
    if not env_rows:
        print(f"{args.domains}: no domain module defines an environment; nothing written", file=sys.stderr)
        return 1
    (BED_DIR / "environments.jsonl").write_text(jsonl(env_rows), encoding="utf-8")
    (BED_DIR / "tasks.jsonl").write_text(jsonl(task_rows), encoding="utf-8")
    (BED_DIR / "bed.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {len(env_rows)} environments, {len(task_rows)} tasks: "
          + ", ".join(f"{s} {n}" for s, n in meta["counts"]["tasks"].items())
          + (f"; LEFT OUT {len(problems)} broken module(s) (listed above)" if problems else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
