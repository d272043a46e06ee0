"""The training reward's judge for stdin and call-based coding tests (TACO, and LiveCodeBench when its
official grader is not installed): each test runs the solution as a fresh program, the verdict is
computed here, outside the sandbox.

* **Real standard streams.** Every test runs in a fresh process (a fork of a runner that has run
  no solution; no int/str digit limit) whose stdin is a file holding the test input and whose
  stdout is a file, so ``sys.stdin.buffer``, ``open(0).read()``, ``sys.stdout.buffer.write`` and
  ``os.write(1, ...)`` behave as on a judge. Call-based tests load the code (``from typing import *`` first, module name
  ``__lopd_solution__``), call ``Solution().<fn>(*args)`` (or the plain function ``<fn>``) and write
  the JSON of the return value; what the code prints is discarded.
* **Verdict out of the solution's reach.** A runner program inside one sandbox
  (:func:`stages.core.exec.sandbox.run_python`) starts the per-test programs and sends back only what
  each one printed and how it exited; the expected outputs never enter the sandbox and the
  comparison runs in the calling process. Whatever a solution patches, forges or writes in there
  (``sys.exit``, ``os._exit``, the runner's records, the runner itself) can only change what counts
  as its own output.
* **Comparison** (:func:`stdout_matches`): lines after stripping, the same number of lines and of
  whitespace-separated tokens per line; equal tokens match; two integer tokens match when their
  values are equal; otherwise two numeric tokens match when ``|got - want| <= 1e-8 + 1e-5 * |want|``
  (the tolerance of ``numpy.allclose``'s defaults, which APPS's and TACO's graders use on numeric
  output). Call-based results match when their JSON values are equal (APPS's one-element-list
  wrapping accepted when a test says ``unwrap``).
* **Stops** at the first test that fails; a test that fails at run time (exception, time limit,
  memory, blocked operation) also stops the runner. ``sys.exit(n)`` ends a program normally: its
  output is compared (as APPS and LiveCodeBench do).
"""
from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

from stages.core.exec import sandbox

_OUT_CAP = 4 * 2**20  # characters of one test's stdout sent back
_INT = re.compile(r"[+-]?\d+")
_NUM = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
RTOL, ATOL = 1e-5, 1e-8

# Runs in the sandbox (audit hook off: it starts one program per test). Reads the spec as JSON on
# stdin and prints one JSON record per test: {i, rc, timed_out, out, err}. Each test program is a
# fork of this runner that points fds 0-2 at its files, builds fresh sys.stdin/stdout/stderr on them
# and runs the sandbox prelude (audit hook, the program as __main__): no interpreter start per test.
_RUNNER = r"""
import json, os, select, signal, sys, traceback
spec = json.load(sys.stdin)
work, func, limit, prelude = os.getcwd(), spec["func"], spec["per_test_s"], spec["prelude"]
CALL = '''import json as _j, os as _o, sys as _s
_fd = _o.dup(1)
_s.stdout = open(_o.devnull, "w")
_ns = {"__name__": "__lopd_solution__"}
exec(compile("from typing import *\\n" + %r, "<solution>", "exec"), _ns)
_f = getattr(_ns["Solution"](), %r) if "Solution" in _ns else _ns[%r]
_r = _j.dumps(_f(*[_j.loads(a) for a in %r])).encode()
while _r:
    _r = _r[_o.write(_fd, _r):]
'''

def child(prog, inp, out, err):
    code = 1
    try:
        os.setsid()
        for fd, path, flags in ((0, inp, os.O_RDONLY), (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            new = os.open(path, flags, 0o600)
            os.dup2(new, fd)
            os.close(new)
        sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.argv = ["-c", work, prog, "hook"]
        exec(compile(prelude, "<prelude>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code & 0xFF)

for i, test in enumerate(spec["tests"]):
    prog, inp = os.path.join(work, "p%d.py" % i), os.path.join(work, "in%d" % i)
    out, err = os.path.join(work, "out%d" % i), os.path.join(work, "err%d" % i)
    if func is None:
        text = spec["code"]
        with open(inp, "wb") as fh:
            fh.write(test.encode("utf-8"))
    else:
        args = [line for line in test.split("\n") if line.strip()]
        text, inp = CALL % (spec["code"], func, func, args), os.devnull
    with open(prog, "w", encoding="utf-8") as fh:
        fh.write(text)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        child(prog, inp, out, err)
    watch = os.pidfd_open(pid)
    done = select.select([watch], [], [], limit)[0]
    os.close(watch)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    rc, timed_out = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), not done
    with open(out, "rb") as fh:
        got = fh.read(spec["cap"]).decode("utf-8", "replace")
    with open(err, "rb") as fh:
        fh.seek(max(0, os.path.getsize(err) - 65536))
        tail = fh.read().decode("utf-8", "replace")
    for path in (prog, inp, out, err):
        if path != os.devnull and os.path.exists(path):
            os.remove(path)
    sys.stdout.write(json.dumps({"i": i, "rc": rc, "timed_out": timed_out, "out": got, "err": tail}) + "\n")
    sys.stdout.flush()
    if timed_out or rc < 0 or spec["blocked"] in tail or spec["failed"] in tail:
        break
"""


def _token_equal(got: str, want: str) -> bool:
    if got == want:
        return True
    if _INT.fullmatch(got) and _INT.fullmatch(want):
        return _int_key(got) == _int_key(want)
    if not (_NUM.fullmatch(got) and _NUM.fullmatch(want)):
        return False
    g, w = float(got), float(want)
    if g in (float("inf"), float("-inf")) or w in (float("inf"), float("-inf")):
        return False
    return abs(g - w) <= ATOL + RTOL * abs(w)


def _int_key(token: str) -> tuple[bool, str]:
    digits = token.lstrip("+-").lstrip("0") or "0"
    return token.startswith("-") and digits != "0", digits


def stdout_matches(got: str, want: str) -> bool:
    """Whether a program's stdout ``got`` matches the expected ``want`` (rule in the module docstring)."""
    g = [ln.strip() for ln in got.strip().split("\n")]
    w = [ln.strip() for ln in want.strip().split("\n")]
    if len(g) != len(w):
        return False
    for x, y in zip(g, w):
        tx, ty = x.split(), y.split()
        if len(tx) != len(ty) or not all(_token_equal(a, b) for a, b in zip(tx, ty)):
            return False
    return True


def _json_value(text: str) -> Any:
    return json.loads(text, parse_int=Decimal)  # no int digit limit on either side


def result_matches(got: str, want: str, unwrap: bool) -> bool:
    """Whether the JSON text a call-based test printed equals the expected JSON ``want``; with
    ``unwrap``, an expected one-element list also matches its element (APPS's convention)."""
    try:
        g, w = _json_value(got), _json_value(want)
    except ValueError:
        return False
    return g == w or (unwrap and isinstance(w, list) and len(w) == 1 and g == w[0])


def _verdict(record: dict[str, Any], test: dict[str, Any], functional: bool, per_test_s: int) -> str:
    status, reason, _ = sandbox.classify(int(record["rc"]), bool(record["timed_out"]), str(record["err"]),
                                         per_test_s, per_test_s)
    if status == "timeout":
        return f"timeout: {reason}"
    if status in ("memory", "blocked"):
        return f"{status}: {reason}"
    if functional and status != "ok":
        return f"runtime error: {reason}"
    if status == "error" and (record["rc"] < 0 or sandbox.FAILED_MARK in str(record["err"])):
        return f"runtime error: {reason}"
    out = str(record["out"])
    ok = (result_matches(out, test["output"], bool(test.get("unwrap"))) if functional
          else stdout_matches(out, test["output"]))
    return "pass" if ok else "wrong answer"


def grade(code: str, tests: list[dict[str, Any]], func_name: str | None, per_test_s: int = 6,
          memory_mb: int = 2048) -> dict[str, Any]:
    """Run ``code`` on ``tests`` (``[{input, output, testtype, unwrap?}]``) and judge it here.

    Args:
        code: the solution (untrusted).
        tests: stdin tests (``input`` fed as stdin, ``output`` the expected stdout) or, with
            ``testtype == "functional"``, call-based ones (one JSON argument per input line, the
            expected return value as JSON).
        func_name: the function call-based tests call.
        per_test_s: wall-clock seconds per test.
        memory_mb: the sandbox's memory cap (:func:`stages.core.exec.sandbox.run_python`).

    Returns:
        ``{passed, total, first_failure}``: tests passed before the first failure, the number of
        tests, and the first failure's label ("wrong answer", "timeout: ...", "runtime error: ...",
        "memory: ...", "blocked: ...", or why the sandbox returned nothing), None when all passed.
    """
    total = len(tests)
    if not code.strip():
        return {"passed": 0, "total": total, "first_failure": "no code block in the answer"}
    functional = [t.get("testtype") == "functional" for t in tests]
    if any(functional) and not func_name:
        return {"passed": 0, "total": total, "first_failure": "call-based tests without a function name"}
    passed, failure = 0, None
    for group in _groups(functional):  # one sandbox per run of same-kind tests (normally all of them)
        spec = {"prelude": sandbox.PRELUDE, "code": code,
                "func": func_name if functional[group[0]] else None, "per_test_s": per_test_s, "cap": _OUT_CAP,
                "blocked": sandbox.BLOCKED_MARK, "failed": sandbox.FAILED_MARK,
                "tests": [tests[i]["input"] for i in group]}
        budget = (per_test_s + 1) * len(group) + 5
        res = sandbox.run_python(_RUNNER, timeout_s=budget, cpu_s=budget, memory_mb=memory_mb, stdin=json.dumps(spec),
                                 max_output_chars=2**31, audit_hook=False)
        records = _records(res.stdout, len(group))
        for k, i in enumerate(group):
            if k not in records:
                failure = f"sandbox {res.status}: {res.reason or 'no result for this test'}"
                break
            verdict = _verdict(records[k], tests[i], functional[i], per_test_s)
            if verdict != "pass":
                failure = verdict
                break
            passed += 1
        if failure:
            break
    return {"passed": passed, "total": total, "first_failure": failure}


def _groups(functional: list[bool]) -> list[list[int]]:
    groups: list[list[int]] = []
    for i, kind in enumerate(functional):
        if groups and functional[groups[-1][0]] == kind:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _records(stdout: str, count: int) -> dict[int, dict[str, Any]]:
    """Per-test records the runner printed (the first well-formed one for each test index)."""
    found: dict[int, dict[str, Any]] = {}
    for line in stdout.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if (isinstance(rec, dict) and isinstance(rec.get("i"), int) and 0 <= rec["i"] < count
                and isinstance(rec.get("rc"), int) and isinstance(rec.get("out"), str)
                and isinstance(rec.get("err"), str) and isinstance(rec.get("timed_out"), bool)):
            found.setdefault(rec["i"], rec)
    return found
