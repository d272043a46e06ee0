"""The training reward's coding judge (stages.envs.judge, used by TACO and by LiveCodeBench without
its official grader): the fast-I/O idioms, numeric tolerance and big integers each pass with a correct
program and fail with a wrong one; solutions that try to forge their verdict score as failures."""
from __future__ import annotations

import pytest

from stages.envs.judge import grade, result_matches, stdout_matches

SUM = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
       {"input": "40 2\n", "output": "42\n", "testtype": "stdin"}]


def _verdict(code: str, tests=SUM, func=None, per_test_s: int = 3) -> dict:
    return grade(code, tests, func, per_test_s=per_test_s)


IDIOMS = {  # name -> (correct program, wrong program) for SUM
    "stdin.buffer.read().split()": (
        "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a + b)",
        "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a - b)"),
    "stdin.buffer.readline": (
        "import sys\ninput = sys.stdin.buffer.readline\na, b = map(int, input().split())\nprint(a + b)",
        "import sys\ninput = sys.stdin.buffer.readline\na, b = map(int, input().split())\nprint(a * b)"),
    "stdout.buffer.write": (
        "import sys\na, b = map(int, input().split())\nsys.stdout.buffer.write(str(a + b).encode() + b'\\n')",
        "import sys\na, b = map(int, input().split())\nsys.stdout.buffer.write(str(a + b + 1).encode())"),
    "open(0).read()": (
        "a, b = map(int, open(0).read().split())\nprint(a + b)",
        "a, b = map(int, open(0).read().split())\nprint(b)"),
    "os.read(0) / os.write(1)": (
        "import os\na, b = map(int, os.read(0, 100).split())\nos.write(1, b'%d\\n' % (a + b))",
        "import os\na, b = map(int, os.read(0, 100).split())\nos.write(1, b'0\\n')"),
}


@pytest.mark.parametrize("idiom", sorted(IDIOMS))
def test_fast_io_idioms_pass_when_correct_and_fail_when_wrong(idiom):
    good, bad = IDIOMS[idiom]
    assert _verdict(good) == {"passed": 2, "total": 2, "first_failure": None}
    wrong = _verdict(bad)
    assert wrong["passed"] == 0 and wrong["first_failure"] == "wrong answer"


def test_floats_compare_with_the_apps_tolerance():
    third = [{"input": "", "output": "0.333333333333\n", "testtype": "stdin"}]
    assert _verdict("print(1 / 3)", third)["first_failure"] is None
    assert _verdict("print(0.3334)", third)["first_failure"] == "wrong answer"
    root2 = [{"input": "2\n", "output": "1.4142135623730951\n", "testtype": "stdin"}]
    assert _verdict("import math\nprint('%.6f' % math.sqrt(int(input())))", root2)["first_failure"] is None
    assert _verdict("import math\nprint('%.3f' % math.sqrt(int(input())))", root2)["first_failure"] == "wrong answer"


def test_comparison_rule():
    assert stdout_matches("3.0000000001 x\n", "3 x")
    assert not stdout_matches("3.001 x", "3 x")
    assert not stdout_matches("1000000001", "1000000000")  # integers compare exactly, not within 1e-5
    assert stdout_matches("007", "7") and stdout_matches("-0", "0")
    assert not stdout_matches("1 2", "1\n2") and not stdout_matches("inf", "1e999")
    assert not stdout_matches("1e999", "1e998")
    assert result_matches("[1, 2.0]", "[1.0, 2]", False) and not result_matches("[1, 2]", "[[1, 2]]", False)
    assert result_matches("[1, 2]", "[[1, 2]]", True) and not result_matches("oops", "1", False)


def test_integers_past_the_4300_digit_limit():
    big = [{"input": "5000\n", "output": "1" + "0" * 5000 + "\n", "testtype": "stdin"}]
    assert _verdict("print(10 ** int(input()))", big)["first_failure"] is None
    assert _verdict("print(10 ** int(input()) + 1)", big)["first_failure"] == "wrong answer"
    call = [{"input": "5000", "output": "1" + "0" * 5000, "testtype": "functional"}]
    assert _verdict("def power(n):\n    return 10 ** n", call, "power")["first_failure"] is None
    assert _verdict("def power(n):\n    return 10 ** n - 1", call, "power")["first_failure"] == "wrong answer"


def test_call_based_tests_ignore_prints_and_accept_a_solution_class():
    tests = [{"input": "3", "output": "6", "testtype": "functional"},
             {"input": "4", "output": "[8]", "testtype": "functional", "unwrap": True}]
    assert _verdict("def double(x):\n    print('noise')\n    return 2 * x", tests, "double")["passed"] == 2
    assert _verdict("class Solution:\n    def double(self, x):\n        return x + x", tests, "double")["passed"] == 2
    assert _verdict("def double(x):\n    return x + 1", tests, "double")["first_failure"] == "wrong answer"


def test_runtime_errors_and_timeouts_stop_the_run():
    crash = _verdict("raise ValueError('boom')")
    assert crash["passed"] == 0 and crash["first_failure"] == "runtime error: ValueError: boom"
    slow = _verdict("import sys\nif sys.stdin.read().startswith('40'):\n    while True: pass\nprint(3)", per_test_s=1)
    assert slow["passed"] == 1 and slow["first_failure"].startswith("timeout")
    assert _verdict("import sys\nprint(sum(map(int, input().split())))\nsys.exit(3)")["passed"] == 2


# Each one prints a wrong answer or nothing and then tries to make the grader say "pass".
HOSTILE = {
    "patches sys.exit": "import sys\nsys.exit = lambda *a: None\nprint(0)\nsys.exit(0)",
    "os._exit before printing": "import os\nos._exit(0)",
    "writes forged records and verdicts into the runner's stdout and a result file":
        "import json, os\n"
        "rec = [json.dumps({'i': i, 'rc': 0, 'timed_out': False, 'out': 'pass', 'err': ''}) for i in range(2)]\n"
        "fake = '\\n'.join(rec + [json.dumps(['pass', 'pass']), json.dumps({'passed': 2, 'total': 2})]) + '\\n'\n"
        "for path in ('/proc/%d/fd/1' % os.getppid(), 'result.json', 'verdicts.json'):\n"
        "    try:\n"
        "        with open(path, 'w') as fh:\n"
        "            fh.write(fake)\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)",
    "patches the grader's module and kills the runner":
        "import os, signal, sys\n"
        "main = sys.modules['__main__']\n"
        "for name in list(vars(main)):\n"
        "    if callable(getattr(main, name)):\n"
        "        setattr(main, name, lambda *a, **k: True)\n"
        "import json\njson.loads = lambda *a, **k: {'passed': 2, 'total': 2}\n"
        "print(0)\nsys.stdout.flush()\n"
        "os.kill(os.getppid(), signal.SIGKILL)",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_solution_cannot_forge_its_verdict(name):
    verdict = _verdict(HOSTILE[name])
    assert verdict["passed"] == 0 and verdict["first_failure"], verdict


# The table "training reward vs LiveCodeBench's grader" of docs/stages/collect.md: one program per row, with the
# verdict each grader gives (True: all tests pass).
DIFFERENCES = [
    ("sys.stdin.buffer", "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))", SUM, True, False),
    ("sys.stdout.buffer.write", "a, b = map(int, input().split())\nimport sys\nsys.stdout.buffer.write(b'%d\\n' % (a + b))",
     SUM, True, False),
    ("open(0).read()", "print(sum(map(int, open(0).read().split())))", SUM, True, False),
    ("float within 1e-5", "print(1 / 3)", [{"input": "", "output": "0.333333333333\n", "testtype": "stdin"}], True, False),
    ("more than 4,300 digits", "print(10 ** 5000)",
     [{"input": "", "output": "1" + "0" * 5000 + "\n", "testtype": "stdin"}], True, False),
    ("sys.exit after the answer", "print(sum(map(int, input().split())))\nraise SystemExit(1)", SUM, True, True),
]


@pytest.mark.parametrize("row", DIFFERENCES, ids=[d[0] for d in DIFFERENCES])
def test_where_the_training_reward_and_livecodebench_differ(row):
    from stages.envs import livecodebench as lcb

    source = lcb.official_testing_util()
    if source is None:
        pytest.skip("nvidia-livecodebench is not installed")
    _, code, tests, ours, official = row
    mine, theirs = grade(code, tests, None, per_test_s=3), lcb.grade_official(code, tests, None, per_test_s=3, source=source)
    assert (mine["passed"] == mine["total"]) == ours, mine
    assert (theirs["passed"] == theirs["total"]) == official, theirs
