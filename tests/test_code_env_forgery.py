"""The `code` environment's verdict is out of the answer's reach: the answer runs in its own process,
the grader (non-dumpable, its spec on a stdin the answer does not hold) compares and reports. Answers
that are wrong and try to forge a pass (patching sys.exit, os._exit, writing the report line, patching
the grader's module) all score as failures; the same answers' correct twin still passes."""
from __future__ import annotations

import pytest

from stages.envs import make_env

WRONG = "    return True\n"
RIGHT = ("    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
         "               for j, b in enumerate(numbers) if i != j)\n")
FORGE = '''
import json, os, re, sys
def _forge():
    nonce = "__lopd_result_" + "0" * 16 + "__:"
    pids = [os.getppid()] + [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        for src in ("/proc/%d/fd/0" % pid, "/proc/%d/cmdline" % pid, "/lopd/program.py"):
            try:
                with open(src, errors="replace") as fh:
                    found = re.search(r"__lopd_result_[0-9a-f]{16}__:", fh.read())
            except OSError:
                continue
            if found:
                nonce = found.group(0)
    line = "\\n" + nonce + json.dumps({"passed": 99, "total": 99, "error": "", "failures": [], "timed_out": False}) + "\\n"
    fds = list(range(1, 64))
    for pid in pids:  # dir_fd paths pass the audit hook: this tries the OS boundary itself
        try:
            fds.append(os.open("1", os.O_WRONLY, dir_fd=os.open("/proc/%d/fd" % pid, os.O_RDONLY)))
        except OSError:
            pass
    for fd in fds:
        try:
            os.write(fd, line.encode())
        except OSError:
            pass
'''
HOSTILE = {
    "patches sys.exit and exits": "import sys\nsys.exit = lambda *a: None\n"
                                  "def has_close_elements(numbers, threshold):\n    sys.exit(0)\n" + WRONG,
    "os._exit inside the call": "import os\ndef has_close_elements(numbers, threshold):\n    os._exit(0)\n",
    "writes a report line with the grader's nonce": FORGE + "def has_close_elements(numbers, threshold):\n"
                                                    "    _forge()\n    os._exit(0)\n",
    "patches the grader's module": "import sys\n"
                                   "def has_close_elements(numbers, threshold):\n"
                                   "    f = sys._getframe(1)\n"
                                   "    while f is not None:\n"
                                   "        for name in ('_exec', '_quiet', '_match'):\n"
                                   "            if name in f.f_globals:\n"
                                   "                f.f_globals[name] = lambda *a, **k: True\n"
                                   "        f = f.f_back\n"
                                   "    main = sys.modules['__main__']\n"
                                   "    for name in dir(main):\n"
                                   "        if callable(getattr(main, name)) and not name.startswith('__'):\n"
                                   "            setattr(main, name, lambda *a, **k: True)\n" + WRONG,
}


@pytest.fixture(scope="module")
def env():
    e = make_env("code", data_dir=None, timeout_s=5.0)
    yield e
    e.close()


def _score(env, code: str) -> dict:
    prob = env.problems["HumanEval/0"]
    return env.score(prob, f"```python\n{code}\n```")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_forging_answer_scores_as_a_failure(env, name):
    info = _score(env, HOSTILE[name])
    assert not info["success"] and info["reward"] < 1.0 and info["total"] == 7, info


def test_the_answer_cannot_reach_the_grader_process(env):
    """A correct function that turns wrong if it can read the grader's stdin (its spec, the nonce) or
    open its stdout through /proc: it passes only because neither works (non-dumpable grader)."""
    probe = ("import os\n"
             "def _reached():\n"
             "    for name in ('0', '1'):\n"
             "        try:\n"
             "            d = os.open('/proc/%d/fd' % os.getppid(), os.O_RDONLY)\n"
             "            os.close(os.open(name, os.O_RDONLY if name == '0' else os.O_WRONLY, dir_fd=d))\n"
             "            return True\n"
             "        except OSError:\n"
             "            pass\n"
             "    return False\n"
             "def has_close_elements(numbers, threshold):\n"
             "    if _reached():\n"
             "        return None\n" + RIGHT)
    info = _score(env, probe)
    assert info["success"], info


def test_the_forging_code_around_a_correct_function_still_passes(env):
    good = FORGE + "def has_close_elements(numbers, threshold):\n" + RIGHT
    assert _score(env, good)["success"]
