"""LiveCodeBench code generation as a one-step environment, graded in the sandbox.

Data: the LiveCodeBench release format (``livecodebench/code_generation_lite``), one problem per
row with ``question_id``, ``question_title``, ``question_content``, ``starter_code``,
``public_test_cases`` and ``private_test_cases`` (JSON strings of ``[{input, output, testtype}]``
with ``testtype`` ``stdin`` or ``functional``), ``metadata`` (JSON string, ``func_name`` for
functional problems) and ``contest_date`` (ISO date-time). Sources, in order:

* ``data_dir``: a ``.jsonl`` / ``.json`` file, or a folder whose ``*.jsonl`` / ``*.json`` files
  are all read (the lite release ships ``test.jsonl`` ... ``test6.jsonl``);
* ``dataset=``: a Hugging Face dataset id or local dataset folder read with ``datasets``
  (``split="test"``).

In the official release ``private_test_cases`` is ``base64(zlib(pickle(json_string)))``. It is
decoded with an unpickler whose ``find_class`` refuses every global, so only pickle's built-in
primitive opcodes (str, list, dict, numbers) can be used; a pickle that names any class or
function is rejected instead of executed. A value that is already a JSON list is used as is.

``release`` selects problems by ``contest_date`` (both ends inclusive). LiveCodeBench publishes
releases as cumulative problem sets; the windows used here are the ones papers evaluating on
"LiveCodeBench v5 / v6" report (assumption, stated in the report): v5 = 2024-08-01..2025-02-01,
v6 = 2024-08-01..2025-05-01.

Grading: with LiveCodeBench's own grader installed (``nvidia-livecodebench``), its ``run_test``
judges the answer in the sandbox, unchanged (:func:`grade_official`). Without it, and for TACO's
training reward, :func:`grade` uses lopd's judge (:mod:`stages.envs.judge`: a fresh program
with real stdin/stdout per test, numeric tokens compared with a tolerance, the verdict computed
outside the sandbox); docs/stages/collect.md's coding-rewards table shows where the two differ. Both
stop at the first failure; reward is 1 when every public and private test passes, else 0.
"""
from __future__ import annotations

import base64
import importlib.util
import io
import json
import pickle
import re
import secrets
import zlib
from datetime import date
from pathlib import Path
from typing import Any

from schemas import Message, Task
from stages.core.data.inputs import read_utf8
from stages.envs.base import EnvError, StepResult, register

RELEASE_WINDOWS: dict[str, tuple[date, date]] = {
    "v5": (date(2024, 8, 1), date(2025, 2, 1)),
    "v6": (date(2024, 8, 1), date(2025, 5, 1)),
}
_SOURCE_HINT = (
    "pass --data-dir <file.jsonl or folder> (LiveCodeBench release files, e.g. test*.jsonl of the HF "
    "dataset livecodebench/code_generation_lite) or dataset=<HF id / local dataset folder>"
)
SYSTEM_PROMPT = (
    "You are an expert Python programmer. You will be given a question (problem specification) and "
    "will generate a correct Python program that matches the specification and passes all tests."
)
_CODE_BLOCK = re.compile(r"```(?:python|py|Python3?)?\s*\n(.*?)```", re.DOTALL)


class _PrimitiveUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in test data")


def decode_tests(value: Any, where: str) -> list[dict[str, str]]:
    """Test cases from a ``*_test_cases`` field: a JSON list, or the release's compressed form.

    Raises:
        EnvError: the value is neither (message names ``where``).
    """
    if isinstance(value, list):
        tests = value
    elif isinstance(value, str) and value.lstrip().startswith("["):
        tests = json.loads(value)
    elif isinstance(value, str):
        try:
            raw = _PrimitiveUnpickler(io.BytesIO(zlib.decompress(base64.b64decode(value)))).load()
            tests = json.loads(raw) if isinstance(raw, str) else raw
        except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as err:
            raise EnvError(f"{where}: cannot decode test cases ({err})") from None
    else:
        raise EnvError(f"{where}: test cases must be a JSON list or an encoded string")
    if not isinstance(tests, list) or not all(isinstance(t, dict) and {"input", "output"} <= t.keys() for t in tests):
        raise EnvError(f"{where}: test cases must be a list of {{input, output, testtype}} objects")
    return tests


def encode_private_tests(tests: list[dict[str, str]]) -> str:
    """The official compressed encoding of ``tests`` (used to build fixtures)."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def _read_rows(data_dir: Path | None, dataset: str | None) -> tuple[list[dict], str]:
    if data_dir is not None:
        path = Path(data_dir)
        files = sorted(p for p in path.glob("*.json*") if p.suffix in (".json", ".jsonl")) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise EnvError(f"livecodebench: no .jsonl/.json files at {path}; {_SOURCE_HINT}")
        rows: list[dict] = []
        for f in files:
            text = read_utf8(f, EnvError)
            try:
                if f.suffix == ".json" and text.lstrip().startswith("["):
                    rows += json.loads(text)
                else:
                    rows += [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError as err:
                raise EnvError(f"{f}: not valid JSON lines ({err.msg} at line {err.lineno})") from None
        return rows, str(path)
    if dataset:
        import datasets

        try:
            return list(datasets.load_dataset(dataset, split="test")), dataset
        except Exception as err:  # datasets raises many types for an unusable source
            raise EnvError(f"livecodebench: cannot load dataset {dataset!r} ({type(err).__name__}); "
                           f"{_SOURCE_HINT}") from None
    raise EnvError(f"livecodebench: no data source; {_SOURCE_HINT}")


def _prompt(row: dict) -> str:
    text = f"### Question:\n{row['question_content']}\n\n"
    if row.get("starter_code"):
        return text + (
            "### Format: You will use the following starter code to write the solution to the problem "
            f"and enclose your code within delimiters.\n```python\n{row['starter_code']}\n```\n\n"
            "### Answer: (use the provided format with backticks)\n"
        )
    return text + (
        "### Format: Read the inputs from stdin solve the problem and write the answer to stdout "
        "(do not directly test on the sample inputs). Enclose your code within delimiters as follows.\n"
        "```python\n# YOUR CODE HERE\n```\n\n### Answer: (use the provided format with backticks)\n"
    )


def load_tasks(data_dir: Path | None, dataset: str | None, release: str | None) -> list[Task]:
    """LiveCodeBench problems as test-split tasks, filtered to the ``release`` window if given.

    Raises:
        EnvError: no source, unreadable file, a row missing a field, or an unknown release.
    """
    if release is not None and release not in RELEASE_WINDOWS:
        raise EnvError(f"livecodebench: unknown release {release!r}; choose one of {', '.join(RELEASE_WINDOWS)}")
    rows, source = _read_rows(data_dir, dataset)
    tasks = []
    for i, row in enumerate(rows):
        where = f"{source} row {i}"
        for key in ("question_id", "question_content", "public_test_cases", "private_test_cases", "contest_date"):
            if key not in row:
                raise EnvError(f"{where}: missing field {key!r}")
        day = date.fromisoformat(str(row["contest_date"])[:10])
        if release is not None and not RELEASE_WINDOWS[release][0] <= day <= RELEASE_WINDOWS[release][1]:
            continue
        meta = row.get("metadata") or "{}"
        meta = json.loads(meta) if isinstance(meta, str) else meta
        tests = decode_tests(row["public_test_cases"], f"{where} public_test_cases")
        tests += decode_tests(row["private_test_cases"], f"{where} private_test_cases")
        if not tests:
            raise EnvError(f"{where}: no test cases")
        if any(t.get("testtype") == "functional" for t in tests) and not meta.get("func_name"):
            raise EnvError(f"{where}: functional tests need metadata.func_name")
        tasks.append(Task(
            task_id=str(row["question_id"]), env="livecodebench", split="test", prompt=_prompt(row),
            metadata=json.dumps({"tests": tests, "func_name": meta.get("func_name"),
                                 "contest_date": str(row["contest_date"]),
                                 "difficulty": row.get("difficulty", "")}),
        ))
    return tasks


def extract_code(text: str) -> str:
    """The last fenced code block of a model answer ("" when there is none)."""
    blocks = _CODE_BLOCK.findall(text)
    return blocks[-1] if blocks else ""


def _sandbox_verdicts(program: str, mark: str, tests: int, per_test_s: int, memory_mb: int) -> tuple[list | None, str]:
    """Run LiveCodeBench's grading program in the sandbox, with Python's default int/str digit limit
    as the official grader has it: (the JSON verdict list it printed after ``mark``, "") or (None,
    why it printed none)."""
    from stages.core.exec.sandbox import run_python

    budget = per_test_s * tests + 5
    res = run_python(program, timeout_s=budget, cpu_s=budget, memory_mb=memory_mb, digit_limit=True)
    marker = next((ln for ln in reversed(res.stdout.splitlines()) if ln.startswith(mark)), None)
    if marker is None:
        return None, f"sandbox {res.status}: {res.reason}"
    return json.loads(marker[len(mark):]), ""


def grade(code: str, tests: list[dict[str, str]], func_name: str | None, per_test_s: int = 6) -> dict[str, Any]:
    """The training reward's verdict on ``code``: :func:`stages.envs.judge.grade` (real
    stdin/stdout per test, numeric tolerance, verdict computed outside the sandbox); returns
    ``{passed, total, first_failure}``."""
    from stages.envs.judge import grade as judge

    return judge(code, tests, func_name, per_test_s)


# verdict codes of LiveCodeBench's testing_util.run_test (nvidia-livecodebench 26.3): False and -2 are
# wrong answers (call-based and stdin), -3 a time limit, -4 a runtime error or code that does not load
_OFFICIAL_CODES = {False: "wrong answer", -1: "runtime error", -2: "wrong answer", -3: "timeout", -4: "runtime error"}


def official_testing_util() -> str | None:
    """Source of LiveCodeBench's own grader (``livecodebench/evaluation/testing_util.py`` of the
    ``nvidia-livecodebench`` package, installed without its dependencies), or None when absent.
    Read as text, never imported here: it runs only inside the sandbox."""
    spec = importlib.util.find_spec("livecodebench")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "evaluation" / "testing_util.py"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def grade_official(code: str, tests: list[dict[str, str]], func_name: str | None, per_test_s: int = 6,
                   source: str | None = None) -> dict[str, Any]:
    """:func:`grade` with LiveCodeBench's own ``run_test`` (its stdin and call-based checks), run in
    the sandbox; ``source`` defaults to :func:`official_testing_util`. Returns
    ``{passed, total, first_failure}`` like :func:`grade`; ``first_failure`` is the verdict's label
    ("wrong answer", "timeout", "runtime error") with the grader's own message in parentheses.

    Raises:
        EnvError: the official grader is not installed.
    """
    source = source or official_testing_util()
    if source is None:
        raise EnvError("LiveCodeBench's grader is not installed (pip install --no-deps nvidia-livecodebench)")
    if not code.strip():
        return {"passed": 0, "total": len(tests), "first_failure": "no code block in the answer"}
    mark = f"__lopd_verdicts_{secrets.token_hex(8)}__"
    sample = {"input_output": json.dumps({"inputs": [t["input"] for t in tests],
                                          "outputs": [t["output"] for t in tests], "fn_name": func_name})}
    # loaded as a module (its reliability_guard writes __builtins__ as a dict, which __main__'s is not)
    program = (f"import json\n_ns = {{'__name__': 'testing_util'}}\n"
               f"exec(compile({source!r}, 'testing_util.py', 'exec'), _ns)\n"
               f"_results, _meta = _ns['run_test']({sample!r}, test={code!r}, timeout={per_test_s})\n"
               f"print({mark!r} + json.dumps([[r if isinstance(r, (bool, int)) else str(r) for r in _results], "
               f"str(_meta.get('error_message') or '')[:300]]))\n")
    verdicts, why = _sandbox_verdicts(program, mark, len(tests), per_test_s, 4096)
    if verdicts is None:
        return {"passed": 0, "total": len(tests), "first_failure": why}
    verdicts, message = verdicts  # the per-test verdicts and the grader's own words on the first failure
    failure = next((v for v in verdicts if v is not True), None)
    label = None if failure is None else _OFFICIAL_CODES.get(failure, str(failure))
    return {"passed": sum(v is True for v in verdicts), "total": len(tests),
            "first_failure": f"{label} ({message})" if label and message else label}


@register("livecodebench")
class LiveCodeBenchEnv:
    """One-step environment: the answer's last ```python block is graded on all tests.

    Args:
        data_dir: release file or folder (see the module docstring).
        max_turns: kept for the protocol; episodes always end after one action.
        dataset: Hugging Face id or local dataset folder, used when ``data_dir`` is None.
        release: ``"v5"`` | ``"v6"`` | None (all problems).
    """

    name = "livecodebench"

    def __init__(self, data_dir: Path | None = None, max_turns: int = 1, dataset: str | None = None,
                 release: str | None = None):
        self.data_dir, self.dataset, self.release = data_dir, dataset, release
        self.max_turns = max_turns
        self._task: Task | None = None

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        """Problems of the selected release (only ``split="test"`` exists).

        Raises:
            EnvError: ``split`` is not ``test``, or the data is missing/malformed.
        """
        if split != "test":
            raise EnvError(f"livecodebench: only split 'test' exists, got {split!r}")
        tasks = load_tasks(self.data_dir, self.dataset, self.release)
        return tasks[:limit] if limit is not None else tasks

    def reset(self, task: Task) -> list[Message]:
        """System prompt + the problem statement."""
        self._task = task
        return [Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=task.prompt)]

    def step(self, action: str) -> StepResult:
        """Grade the answer; always ends the episode."""
        if self._task is None:
            raise EnvError("livecodebench: step() before reset()")
        meta = self._task.meta
        source = official_testing_util()
        if source is not None:
            verdict = grade_official(extract_code(action), meta["tests"], meta.get("func_name"), source=source)
        else:
            verdict = grade(extract_code(action), meta["tests"], meta.get("func_name"))
        ok = verdict["passed"] == verdict["total"]
        grader = "livecodebench testing_util" if source is not None else "lopd harness"
        return StepResult([], reward=1.0 if ok else 0.0, done=True, info={**verdict, "success": ok, "grader": grader})

    def close(self) -> None:
        """Nothing to release."""
