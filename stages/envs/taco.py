"""TACO-format coding problems as a one-step environment graded in the sandbox: the paper's coding
training corpus (the TACO subset of DeepCoder, B.2 of the LOPD paper).

Data: rows with the problem statement (``problem``, or TACO's own ``question``), the tests
(``tests``, or TACO's ``input_output``: a dict or its JSON string, ``{"inputs": [...],
"outputs": [...], "fn_name"?: str}``), optionally ``starter_code``, ``solutions`` (a list, or its
JSON string; the first one is the reference answer of ``collect --reference``) and an id
(``id``, ``name``, else the row index). With ``fn_name`` the tests are call-based: each input is
the list of arguments of ``fn_name`` (a plain function, or a method of ``class Solution``) and each
output the expected return value (or it wrapped in a one-element list, APPS's convention);
otherwise each input is stdin and each output the expected stdout. Sources: ``data_dir``, a
``.parquet`` / ``.jsonl`` / ``.json`` file or a folder of them, or ``dataset=`` a Hugging Face id
(``agentica-org/DeepCoder-Preview-Dataset`` with ``config="taco"``), read with ``datasets``;
with neither, the 20 practice problems of ``examples/coding_train`` (written for lopd, in this
format, from no benchmark: the offline coding path of a CPU machine; labelled as such).

Splits: a stable hash of the task id puts ``test_percent`` (default 10) of the problems in
``test``, the rest in ``train``. Grading: the LiveCodeBench harness
(:func:`stages.envs.livecodebench.grade`, sandboxed, stops at the first failure); reward 1
when every test passes, else 0 (B.2). Prompts: A.5's coding system prompt and LiveCodeBench's
question format.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from schemas import Message, Task
from stages.envs.base import EnvError, StepResult, register
from stages.envs.livecodebench import SYSTEM_PROMPT, extract_code, grade

PRACTICE_DIR = Path(__file__).resolve().parents[2] / "examples" / "coding_train"
_HINT = ("pass --data-dir <TACO/DeepCoder .parquet/.jsonl file or folder> (e.g. the taco/ folder of the "
         "HF dataset agentica-org/DeepCoder-Preview-Dataset)")


def _json(value: Any, where: str, field: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise EnvError(f"{where}: field {field!r} is not valid JSON") from None
    return value


def _read_rows(data_dir: Path | None, dataset: str | None, config: str | None) -> tuple[list[dict], str]:
    import datasets

    datasets.disable_progress_bars()
    if data_dir is not None:
        path = Path(data_dir)
        files = (sorted(p for p in path.rglob("*") if p.suffix in (".parquet", ".jsonl", ".json"))
                 if path.is_dir() else [path])
        if not files or not all(f.is_file() for f in files):
            raise EnvError(f"taco: no .parquet/.jsonl/.json files at {path}; {_HINT}")
        kinds = {f.suffix for f in files}
        if len(kinds) > 1:
            raise EnvError(f"taco: {path} mixes {', '.join(sorted(kinds))} files; point --data-dir at one kind")
        builder = "parquet" if ".parquet" in kinds else "json"
        try:
            rows = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train")
        except Exception as err:  # datasets raises many types for an unreadable file
            raise EnvError(f"taco: cannot read {path} ({type(err).__name__}: {str(err)[:200]})") from None
        return list(rows), str(path)
    if dataset:
        try:
            return list(datasets.load_dataset(dataset, config, split="train")), f"{dataset}[{config}]"
        except Exception as err:  # noqa: BLE001 - network, missing config, ...
            raise EnvError(f"taco: cannot load dataset {dataset!r} ({type(err).__name__}); {_HINT}") from None
    raise EnvError(f"taco: no data; {_HINT}")


def _tests(spec: Any, where: str) -> tuple[list[dict[str, Any]], str | None]:
    """TACO's ``{inputs, outputs, fn_name}`` as the harness's ``[{input, output, testtype}]``."""
    spec = _json(spec, where, "tests")
    if not isinstance(spec, dict) or not isinstance(spec.get("inputs"), list) \
            or not isinstance(spec.get("outputs"), list) or len(spec["inputs"]) != len(spec["outputs"]):
        raise EnvError(f"{where}: field 'tests' must hold equal-length 'inputs' and 'outputs' lists")
    if not spec["inputs"]:
        raise EnvError(f"{where}: field 'tests' has no test case")
    fn = spec.get("fn_name") or None
    tests = []
    for given, want in zip(spec["inputs"], spec["outputs"]):
        if fn:
            args = given if isinstance(given, list) else [given]
            tests.append({"input": "\n".join(json.dumps(a) for a in args), "output": json.dumps(want),
                          "testtype": "functional", "unwrap": True})
        else:
            tests.append({"input": given if isinstance(given, str) else "\n".join(map(str, given)),
                          "output": want if isinstance(want, str) else "\n".join(map(str, want)),
                          "testtype": "stdin"})
    return tests, fn


def _prompt(statement: str, starter: str) -> str:
    text = f"### Question:\n{statement.strip()}\n\n"
    if starter.strip():
        return text + ("### Format: Complete the following starter code and enclose your code within "
                       f"delimiters.\n```python\n{starter.rstrip()}\n```\n\n### Answer: (use the provided "
                       "format with backticks)\n")
    return text + ("### Format: Read the inputs from stdin, solve the problem and write the answer to "
                   "stdout. Enclose your code within delimiters as follows.\n```python\n# YOUR CODE HERE\n"
                   "```\n\n### Answer: (use the provided format with backticks)\n")


def _bucket(task_id: str) -> int:
    return int(hashlib.sha256(f"lopd-taco:{task_id}".encode()).hexdigest()[:8], 16) % 100


@register("taco")
class TacoEnv:
    """One-step TACO-format coding environment (module docstring).

    Args:
        data_dir: a data file or folder; dataset, config: a Hugging Face id and its config
            (used when ``data_dir`` is None); test_percent: share of problems in ``test``.
    """

    name = "taco"

    def __init__(self, data_dir: Path | None = None, max_turns: int = 1, dataset: str | None = None,
                 config: str | None = "taco", test_percent: int = 10):
        self.practice = data_dir is None and not dataset
        self.data_dir, self.dataset, self.config = (PRACTICE_DIR if self.practice else data_dir), dataset, config
        self.data_source = (f"{PRACTICE_DIR} (20 practice problems written for lopd, not TACO)" if self.practice
                            else str(data_dir or f"{dataset}[{config}]"))
        self.max_turns, self.test_percent = max_turns, test_percent
        self._task: Task | None = None
        self._tasks: list[Task] | None = None

    def _load(self) -> list[Task]:
        if self._tasks is None:
            rows, source = _read_rows(self.data_dir, self.dataset, self.config)
            tasks = []
            for i, row in enumerate(rows):
                where = f"{source} row {i}"
                statement = row.get("problem") or row.get("question")
                if not isinstance(statement, str) or not statement.strip():
                    raise EnvError(f"{where}: field 'problem' (or 'question') missing or empty")
                tests, fn = _tests(row.get("tests", row.get("input_output")), where)
                solutions = _json(row.get("solutions") or [], where, "solutions")
                task_id = f"taco/{row.get('id') or row.get('name') or i}"
                split = "test" if _bucket(task_id) < self.test_percent else "train"
                tasks.append(Task(task_id=task_id, env=self.name, split=split,
                                  prompt=_prompt(statement, row.get("starter_code") or ""),
                                  metadata=json.dumps({"tests": tests, "func_name": fn, "source": source,
                                                       "solution": solutions[0] if solutions else None})))
            self._tasks = tasks
        return self._tasks

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        """Problems of ``split`` ("train" | "test"), in data order, at most ``limit``.

        Raises:
            EnvError: unknown split, or missing/malformed data (file, row and field named).
        """
        if split not in ("train", "test"):
            raise EnvError(f"taco: unknown split {split!r}; use 'train' or 'test'")
        out = [t for t in self._load() if t.split == split]
        return out[:limit] if limit is not None else out

    def reset(self, task: Task) -> list[Message]:
        """A.5's coding system prompt + the problem."""
        self._task = task
        return [Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=task.prompt)]

    def reference_actions(self, task: Task) -> list[str]:
        """The row's first solution as an answer (EnvError when the row has none)."""
        solution = task.meta.get("solution")
        if not solution:
            raise EnvError(f"{task.task_id}: no solution in the data")
        return [f"```python\n{solution.strip()}\n```"]

    def step(self, action: str) -> StepResult:
        """Grade the answer's last code block on every test; the episode always ends."""
        if self._task is None:
            raise EnvError("taco: step() before reset()")
        meta = self._task.meta
        verdict = grade(extract_code(action), meta["tests"], meta.get("func_name"))
        ok = verdict["passed"] == verdict["total"]
        return StepResult([], reward=1.0 if ok else 0.0, done=True, info={**verdict, "success": ok})

    def close(self) -> None:
        """Nothing to release."""
