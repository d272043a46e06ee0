"""Evaluation reports keep each task's transcript and `lopd show` prints it (issue 31 item 1):
a scripted model on the LiveCodeBench fixture tasks, one answered right and two wrong."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from lopd_cli.main import app
from tests.test_evaluate import FIXTURES, LCB_SOLUTIONS, _run

runner = CliRunner()
IDS = ["lcbfx_stdin", "lcbfx_functional", "lcbfx_compressed"]


def _report(tmp_path):
    scripts = [[f"```python\n{LCB_SOLUTIONS['lcbfx_stdin']}```"], ["I do not know."], ["print(1)"]]
    _run(tmp_path, scripts, bench="livecodebench", data_dir=str(FIXTURES / "livecodebench"), release="v6", model="tiny")
    return tmp_path / "report.json"


def test_report_keeps_each_tasks_transcript_and_show_filters_it(tmp_path):
    path = _report(tmp_path)
    rows = {r["task_id"]: r for r in json.loads(path.read_text())["per_task"]}
    assert set(rows) == set(IDS)
    for row in rows.values():  # the prompt the model saw and what it answered
        roles = [m["role"] for m in row["messages"]]
        assert roles[-1] == "assistant" and "user" in roles
    assert sorted(r["messages"][-1]["content"] for r in rows.values()) == sorted(
        [f"```python\n{LCB_SOLUTIONS['lcbfx_stdin']}```", "I do not know.", "print(1)"])
    answered = {r["messages"][-1]["content"]: r for r in rows.values()}
    assert answered["I do not know."]["success"] is False

    shown = runner.invoke(app, ["show", str(path), "--limit", "10"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "3 of 3 tasks shown" in shown.output and "I do not know." in shown.output
    failed = runner.invoke(app, ["show", str(path), "--failed"], env={"COLUMNS": "200"})
    n_failed = sum(not r["success"] for r in rows.values())
    assert f"{n_failed} of 3 tasks shown ({n_failed} match --failed)" in failed.output
    assert "I do not know." in failed.output
    first = runner.invoke(app, ["show", str(path), "--failed", "--limit", "1"], env={"COLUMNS": "200"})
    assert f"1 of 3 tasks shown ({n_failed} match --failed)" in first.output
    assert all(task_id in failed.output for task_id, r in rows.items() if not r["success"])
    one = runner.invoke(app, ["show", str(path), "--task", "functional"], env={"COLUMNS": "200"})
    assert "1 of 3 tasks shown" in one.output and "lcbfx_functional" in one.output and "lcbfx_stdin" not in one.output
    assert "reward" in one.output


def test_show_refuses_what_is_not_a_report(tmp_path):
    bad = tmp_path / "metrics.json"
    bad.write_text('{"scores": {}}')
    result = runner.invoke(app, ["show", str(bad)])
    assert result.exit_code == 2 and "field 'per_task' is missing" in result.output
    result = runner.invoke(app, ["show", str(tmp_path / "nope.json")])
    assert result.exit_code == 2 and "no such report" in result.output


def test_show_reads_a_store_with_filters(tmp_path):
    from tests.test_coldstart import make_traj
    from stages.core.data.store import ExperienceStore

    store = ExperienceStore.open(tmp_path / "store")
    rows = [make_traj("a", 1, 2), make_traj("b", 3, 4, success=False), make_traj("c", 5, 6, success=False)]
    rows[2] = rows[2].model_copy(update={"run_id": "distill-x"})
    store.append(rows)
    out = runner.invoke(app, ["show", str(tmp_path / "store"), "--limit", "10"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "3 of 3 trajectories shown" in out.output
    assert "-> add(" in out.output and "The answer is 3." in out.output  # the transcript, tool calls included
    failed = runner.invoke(app, ["show", str(tmp_path / "store"), "--failed"], env={"COLUMNS": "200"})
    assert "2 of 2 trajectories shown" in failed.output and "add-1-2" not in failed.output
    one = runner.invoke(app, ["show", str(tmp_path / "store"), "--run-id", "distill-x"], env={"COLUMNS": "200"})
    assert "1 of 1 trajectories shown" in one.output and "add-5-6 [distill-x]" in one.output
    default_run = rows[0].run_id
    assert f"runs in the store (trajectories): {default_run} (2), distill-x (1)" in one.output
    wrong = runner.invoke(app, ["show", str(tmp_path / "store"), "--run-id", "distill-y"], env={"COLUMNS": "200"})
    assert wrong.exit_code == 2 and "trajectories shown" not in wrong.output
    assert "no run 'distill-y'; its runs (trajectories):" in wrong.output and "distill-x (1)" in wrong.output
    by_task = runner.invoke(app, ["show", str(tmp_path / "store"), "--task", "3-4"], env={"COLUMNS": "200"})
    assert "1 of 3 trajectories shown" in by_task.output and "add-3-4" in by_task.output
    report = tmp_path / "r.json"
    report.write_text('{"per_task": []}')
    mixed = runner.invoke(app, ["show", str(report), "--run-id", "r"])
    assert mixed.exit_code == 2 and "filter a store folder" in mixed.output
    empty = tmp_path / "empty"
    empty.mkdir()
    notstore = runner.invoke(app, ["show", str(empty)])
    assert notstore.exit_code != 0 and "no experience store" in notstore.output and "Traceback" not in notstore.output
    for limit in ("0", "-1"):  # -1 would slice off the last trajectory
        res = runner.invoke(app, ["show", str(tmp_path / "store"), "--limit", limit])
        assert res.exit_code == 2 and f"error: --limit {limit}: show at least 1 task" in res.output, res.output


def test_tool_call_arguments_show_as_json_not_as_an_escaped_string():
    from rich.console import Console

    from stages.show import render_task

    def shown(arguments) -> str:
        console = Console(record=True, width=200)
        console.print(render_task({"task_id": "t", "messages": [
            {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": arguments}]}]}))
        return console.export_text()

    assert '-> add({"a": 1, "b": "x"})' in shown('{"a": 1, "b": "x"}')  # stored as a JSON string
    assert '-> add({"a": 1})' in shown({"a": 1})
    assert "-> add(a=1, b)" in shown("a=1, b")  # not JSON: as the model wrote it


def test_terminal_control_characters_of_model_output_are_escaped():
    from rich.console import Console

    from stages.show import printable, render_task

    hostile = "ok\x1b[2J\x1b]0;pwned\x07\rback\u202eevil\nnext\tline"
    assert printable(hostile) == "ok\\x1b[2J\\x1b]0;pwned\\x07\\x0dback\\u202eevil\nnext\tline"
    console = Console(record=True, width=200, force_terminal=True)
    console.print(render_task({"task_id": "t\x1b", "messages": [
        {"role": "assistant", "content": hostile, "tool_calls": [{"name": "f\x1b", "arguments": {"a": "\x07"}}]}],
        "info": {"error": "\x1b[31m"}}))
    text = console.export_text()
    assert "\x1b[2J" not in text and "\x07" not in text and "\r" not in text and "\u202e" not in text
    assert "\\x1b[2J" in text and "f\\x1b(" in text


def test_a_filter_that_matches_nothing_says_so(tmp_path):
    from tests.test_coldstart import make_traj
    from stages.core.data.store import ExperienceStore

    ExperienceStore.open(tmp_path / "store").append([make_traj("a", 1, 2), make_traj("b", 3, 4)])
    out = runner.invoke(app, ["show", str(tmp_path / "store"), "--failed"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "note: none of the store's 2 trajectories matches --failed" in out.output


def test_a_report_filter_that_matches_nothing_says_so_and_the_header_is_terminal_safe(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"bench": "b\x1b[2J", "model": "m\u202e[bold]x[/]",
                                "per_task": [{"task_id": "t1", "success": True, "reward": 1.0}]}))
    out = runner.invoke(app, ["show", str(path), "--task", "zzz"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "0 of 1 tasks shown" in out.output
    assert "note: none of the report's 1 tasks matches --task zzz" in out.output
    assert "\x1b" not in out.output and "\u202e" not in out.output
    assert "b\\x1b[2J - m\\u202e[bold]x[/]" in out.output  # escaped, and markup printed as text

