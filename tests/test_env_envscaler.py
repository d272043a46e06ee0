"""EnvScaler environment: loading, split, scripted episodes, isolation of misbehaving environments."""
from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from schemas import Task
from stages.envs import EnvError, make_env
from stages.envs.base import AGENTIC_RULES
from stages.envs.envscaler_data import FIXTURES_DIR

BAD_DIR = Path(__file__).parent / "fixtures" / "envscaler_bad"


def call(name: str, **args) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


# Oracle action sequences for every bundled fixture task, one tool call per action; a plain final
# answer follows.
ORACLE = {
    "lib-001": [call("search_books", query="Dune"), call("checkout_book", member_id="M-100", book_id="B-2")],
    "lib-002": [call("return_book", member_id="M-200", book_id="B-3"), call("checkout_book", member_id="M-200", book_id="B-4")],
    "lib-003": [call("get_member", member_id="M-300"), call("return_book", member_id="M-300", book_id="B-1"),
                call("checkout_book", member_id="M-300", book_id="B-5")],
    "cal-001": [call("list_rooms"), call("book_meeting", title="Design review", room_id="R-B", day="2025-03-04",
                                         start="10:00", end="11:00", attendees=6)],
    "cal-002": [call("list_meetings", day="2025-03-05"), call("cancel_meeting", meeting_id="MTG-1"),
                call("book_meeting", title="Budget sync", room_id="R-A", day="2025-03-05", start="15:00",
                     end="15:30", attendees=3)],
    "shop-001": [call("create_order", customer="liu", items=[{"sku": "SKU-MUG", "qty": 2}, {"sku": "SKU-TEA", "qty": 1}])],
    "shop-002": [call("get_order", order_id="O-1001"), call("cancel_order", order_id="O-1001")],
    "bank-001": [call("transfer", from_account="A-1", to_account="A-2", amount=250)],
    "bank-002": [call("deposit", account_id="A-3", amount=100), call("freeze_account", account_id="A-3")],
    "bank-003": [call("get_balance", account_id="A-4"), call("transfer", from_account="A-4", to_account="A-5", amount=640.55)],
}


def all_tasks(env) -> dict[str, Task]:
    return {t.task_id: t for split in ("train", "test") for t in env.tasks(split)}


def play(env, task: Task, actions: list[str], final: str = "All done."):
    env.reset(task)
    for action in actions:
        result = env.step(action)
        assert not result.done, result.info
        assert result.observation and all(m.role == "tool" for m in result.observation)
    return env.step(final)


@pytest.fixture
def env():
    e = make_env("envscaler")  # bundled fixtures
    yield e
    e.close()


@pytest.fixture
def bad_env():
    e = make_env("envscaler", data_dir=BAD_DIR, call_timeout_s=3.0, check_timeout_s=0.5, memory_mb=128,
                 episode_rules="lenient")
    yield e
    e.close()


@pytest.mark.parametrize("rules", ["official", "lenient"])
def test_oracle_reaches_full_reward_on_every_fixture_task(rules):
    env = make_env("envscaler", episode_rules=rules)
    tasks = all_tasks(env)
    assert set(tasks) == set(ORACLE)
    for task_id, actions in ORACLE.items():
        result = play(env, tasks[task_id], actions)
        assert result.done and result.reward == 1.0, (task_id, result.info)
        assert result.info["success"] is True and result.info["end"] == "final_answer"
        assert result.info["episode_rules"] == rules and tasks[task_id].meta["episode_rules"] == rules
    env.close()


def test_reset_messages_and_task_fields(env):
    task = all_tasks(env)["shop-001"]  # this env row stores `tools` as a JSON string
    assert [t["function"]["name"] for t in task.tool_schemas] == ["get_product", "get_order", "create_order", "cancel_order"]
    meta = task.meta
    assert meta["env_id"] == "env_store" and meta["split_seed"] == 0 and meta["num_checks"] == 3
    system, user = env.reset(task)
    assert system.role == "system" and "Only pending orders can be cancelled" in system.content
    assert "<tool_call>" in system.content
    # A.5 of the LOPD paper: one tool per step, read before write, end with "Task Completed"
    assert AGENTIC_RULES in system.content and '"Task Completed"' in system.content
    assert user.role == "user" and user.content == task.prompt


@pytest.mark.parametrize("rules, third", [("official", 0.3333), ("lenient", 1 / 3)])  # official: 4 decimals
def test_noop_gets_hand_computed_partial_reward(rules, third):
    env = make_env("envscaler", episode_rules=rules)
    tasks = all_tasks(env)
    # lib-001: only "Emma is still available" holds on the initial state -> 1/3.
    result = play(env, tasks["lib-001"], [], final="I could not help.")
    assert result.done and result.reward == third
    assert [c["passed"] for c in result.info["checks"]] == [False, False, True]
    assert result.info["success"] is False
    # shop-002: only "O-1002 is still shipped" holds -> 1/3; bank-003: nothing -> 0.
    assert play(env, tasks["shop-002"], []).reward == third
    assert play(env, tasks["bank-003"], []).reward == 0.0


def test_tool_error_unknown_tool_and_parse_error_are_observations():
    env = make_env("envscaler", episode_rules="lenient")
    task = all_tasks(env)["bank-001"]
    env.reset(task)
    r = env.step(call("transfer", from_account="A-1", to_account="A-2", amount=99999))
    assert not r.done and "insufficient funds" in r.observation[0].content
    r = env.step(call("rm_rf", path="/"))
    assert not r.done and "unknown tool 'rm_rf'" in r.observation[0].content
    r = env.step('<tool_call>{"name": "transfer", "arguments": {broken</tool_call>')
    assert not r.done and r.tool_calls == [] and r.observation[0].role == "user"
    assert "could not be parsed" in r.observation[0].content
    assert env.step("Giving up.").reward == 0.0


def test_step_cap_ends_and_scores_episode_under_lenient_rules():
    e = make_env("envscaler", max_turns=2, episode_rules="lenient")
    try:
        task = all_tasks(e)["bank-001"]
        e.reset(task)
        assert not e.step(call("get_balance", account_id="A-1")).done
        r = e.step(call("transfer", from_account="A-1", to_account="A-2", amount=250))
        assert r.done and r.info["end"] == "step_cap" and r.reward == 1.0
        with pytest.raises(EnvError, match="reset"):
            e.step("more")
    finally:
        e.close()


def test_raising_nonbool_and_hanging_checks_count_as_failed(bad_env):
    task = all_tasks(bad_env)["count-001"]
    bad_env.reset(task)
    r = bad_env.step(call("fail"))
    assert "ValueError: tool exploded" in r.observation[0].content  # a raising tool is an observation
    r = bad_env.step(call("increment", by=2))
    assert r.observation[0].content == '{"success": true, "data": 7}'  # stray print() did not corrupt the channel
    r = bad_env.step("done")
    checks = r.info["checks"]
    assert [c["passed"] for c in checks] == [True, False, True, False, False]
    assert "KeyError" in checks[1]["error"] and "not bool" in checks[3]["error"] and "timed out" in checks[4]["error"]
    assert r.reward == pytest.approx(2 / 5) and r.info["success"] is False


@pytest.mark.parametrize(
    "task_id, actions, reason",
    [
        ("loop-001", [call("ping"), call("spin")], "timed out"),
        ("loop-001", [call("hoard")], "MemoryError"),
        ("hog-001", [], "MemoryError"),
        ("stuck-001", [], "timed out"),
    ],
)
def test_misbehaving_environment_fails_episode_and_env_stays_usable(bad_env, task_id, actions, reason):
    tasks = all_tasks(bad_env)
    bad_env.reset(tasks[task_id])
    result = None
    for action in actions + ["final"]:
        result = bad_env.step(action)
        if result.done:
            break
    assert result.done and result.reward == 0.0 and result.info["end"] == "env_failure"
    assert reason in result.info["error"] and result.info["success"] is False
    assert bad_env._worker is None  # killed and cleaned up
    follow_up = play(bad_env, tasks["count-001"], [call("increment", by=2)])
    assert follow_up.reward == pytest.approx(2 / 5)


def test_split_is_deterministic_disjoint_and_proportional(tmp_path):
    a, b = make_env("envscaler"), make_env("envscaler")
    train, test = [t.task_id for t in a.tasks("train")], [t.task_id for t in a.tasks("test")]
    assert train == [t.task_id for t in b.tasks("train")] and test == [t.task_id for t in b.tasks("test")]
    assert not set(train) & set(test) and len(train) + len(test) == 10
    assert len(test) == 2  # 10 tasks < 2 * test_size -> 20% held out
    assert all(t.split == "test" for t in a.tasks("test")) and len(a.tasks("train", limit=3)) == 3
    other = make_env("envscaler", seed=7)
    assert other.tasks("test")[0].meta["split_seed"] == 7
    assert [t.task_id for t in other.tasks("test") + other.tasks("train")] != test + train
    assert len(make_env("envscaler", test_size=3).tasks("test")) == 3  # 10 >= 2 * 3 -> test_size
    with pytest.raises(EnvError, match="split"):
        a.tasks("dev")


def test_large_dataset_holds_out_test_size(tmp_path):
    rows = [json.loads(line) for line in (FIXTURES_DIR / "tasks.jsonl").read_text().splitlines()]
    many = [{**rows[i % len(rows)], "task_id": f"t{i:03d}"} for i in range(25)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in many))
    shutil.copy(FIXTURES_DIR / "environments.jsonl", tmp_path / "environments.jsonl")
    e = make_env("envscaler", data_dir=tmp_path, test_size=10)
    test, train = e.tasks("test"), e.tasks("train")
    assert len(test) == 10 and len(train) == 15 and not {t.task_id for t in test} & {t.task_id for t in train}



def _fixture_copy(tmp_path, patch) -> Path:
    """The bundled fixtures in ``tmp_path`` with ``patch(row)`` applied to every task row."""
    rows = [json.loads(line) for line in (FIXTURES_DIR / "tasks.jsonl").read_text().splitlines()]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(patch(r)) + "\n" for r in rows))
    shutil.copy(FIXTURES_DIR / "environments.jsonl", tmp_path / "environments.jsonl")
    return tmp_path


def test_rows_with_their_own_split_keep_it_and_play_their_reference_actions(tmp_path):
    def patch(row):
        calls = [json.loads(a[len("<tool_call>"):-len("</tool_call>")]) for a in ORACLE[row["task_id"]]
                 if a.count("<tool_call>") == 1]
        split = {"lib": "warmup", "cal": "transfer", "shop": "test"}.get(row["task_id"].split("-")[0], "train")
        return {**row, "split": split, "reference_actions": calls}

    folder = _fixture_copy(tmp_path, patch)
    (folder / "bed.json").write_text(json.dumps({"label": "a test bed (not the EnvScaler release)"}))
    e = make_env("envscaler", data_dir=folder)
    ids = {s: [t.task_id for t in e.tasks(s)] for s in ("train", "test", "transfer", "warmup")}
    assert sorted(ids["warmup"]) == ["lib-001", "lib-002", "lib-003"] and sorted(ids["test"]) == ["shop-001", "shop-002"]
    assert sorted(ids["transfer"]) == ["cal-001", "cal-002"] and sorted(ids["train"]) == ["bank-001", "bank-002", "bank-003"]
    assert ids == {s: [t.task_id for t in make_env("envscaler", data_dir=folder).tasks(s)] for s in ids}
    assert "a test bed (not the EnvScaler release)" in e.data_source and not e.fixtures
    task = e.tasks("train")[0]
    actions = e.reference_actions(task)
    assert actions[-1] == "Task Completed" and len(actions) == len(patch({"task_id": task.task_id})["reference_actions"]) + 1
    e.reset(task)
    results = [e.step(a) for a in actions]
    assert results[-1].done and results[-1].reward == 1.0
    with pytest.raises(EnvError, match="reference_actions"):
        make_env("envscaler").reference_actions(make_env("envscaler").tasks("train")[0])
    with pytest.raises(EnvError, match="warmup"):
        e.tasks("dev")


@pytest.mark.parametrize("patch, message", [
    (lambda r: {**r, "split": "train"} if r["task_id"] == "lib-001" else r, "'split' is set on 1 of 10"),
    (lambda r: {**r, "split": 3}, "field 'split'"),
    (lambda r: {**r, "reference_actions": [{"name": "x"}]}, "field 'reference_actions'"),
])
def test_bad_split_and_reference_fields_name_the_field(tmp_path, patch, message):
    with pytest.raises(EnvError, match=message):
        make_env("envscaler", data_dir=_fixture_copy(tmp_path, patch))

def test_json_string_and_parsed_forms_load_identically(tmp_path):
    def rewrite(kind: str, name: str, fields: tuple[str, ...], to_string: bool) -> None:
        out = []
        for line in (FIXTURES_DIR / name).read_text().splitlines():
            row = json.loads(line)
            for f in fields:
                value = json.loads(row[f]) if isinstance(row[f], str) else row[f]
                row[f] = json.dumps(value) if to_string else value
            out.append(row)
        (tmp_path / kind / name).write_text(json.dumps(out))  # also exercises the plain-JSON list form

    loaded = {}
    for kind, to_string in (("str", True), ("parsed", False)):
        (tmp_path / kind).mkdir()
        rewrite(kind, "environments.jsonl", ("tools",), to_string)
        rewrite(kind, "tasks.jsonl", ("init_config", "checklist_with_func"), to_string)
        for p in (tmp_path / kind).iterdir():
            p.rename(p.with_suffix(".json"))
        env = make_env("envscaler", data_dir=tmp_path / kind)
        loaded[kind] = env
        assert play(env, all_tasks(env)["bank-001"], ORACLE["bank-001"]).reward == 1.0
    assert loaded["str"].data.tasks == loaded["parsed"].data.tasks and len(loaded["str"].data.tasks) == 10
    assert loaded["str"].data.envs == loaded["parsed"].data.envs
    strip = lambda env: {k: (t.split, t.tools, {**t.meta, "source": ""}) for k, t in all_tasks(env).items()}
    assert strip(loaded["str"]) == strip(loaded["parsed"])


def test_explicit_files_and_dict_keyed_envs(tmp_path):
    envs = {json.loads(l)["env_id"]: json.loads(l) for l in (FIXTURES_DIR / "environments.jsonl").read_text().splitlines()}
    (tmp_path / "my_envs.json").write_text(json.dumps(envs))
    e = make_env("envscaler", envs_file=tmp_path / "my_envs.json", tasks_file=FIXTURES_DIR / "tasks.jsonl")
    assert len(all_tasks(e)) == 10


@pytest.mark.parametrize(
    "env_patch, task_patch, message",
    [
        ({"tools": "[not json"}, {}, "environments.jsonl: row 0: field 'tools' is not valid JSON"),
        ({"env_class_code": None}, {}, "environments.jsonl: row 0: missing field 'env_class_code'"),
        ({}, {"init_config": [1, 2]}, "tasks.jsonl: row 0 (task lib-001): field 'init_config' must be a dict"),
        ({}, {"env_id": "nope"}, "tasks.jsonl: row 0 (task lib-001): field 'env_id' = 'nope' names no loaded environment"),
        ({}, {"checklist_with_func": [{"check_item": "x"}]}, "field 'checklist_with_func' holds an entry without a check_func"),
    ],
)
def test_malformed_rows_raise_env_error_naming_file_and_field(tmp_path, env_patch, task_patch, message):
    for name, patch in (("environments.jsonl", env_patch), ("tasks.jsonl", task_patch)):
        lines = (FIXTURES_DIR / name).read_text().splitlines()
        lines[0] = json.dumps({**json.loads(lines[0]), **patch})
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    with pytest.raises(EnvError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        make_env("envscaler", data_dir=tmp_path)


def test_unreadable_or_ambiguous_sources_raise_env_error(tmp_path):
    shutil.copy(FIXTURES_DIR / "environments.jsonl", tmp_path / "environments.jsonl")
    (tmp_path / "tasks.jsonl").write_text('{"task_id": 1,\n')
    with pytest.raises(EnvError, match=r"tasks.jsonl: invalid JSON at line 1"):
        make_env("envscaler", data_dir=tmp_path)
    (tmp_path / "more_tasks.json").write_text("[]")
    with pytest.raises(EnvError, match="need exactly one tasks file"):
        make_env("envscaler", data_dir=tmp_path)
    with pytest.raises(EnvError, match="go together"):
        make_env("envscaler", envs_file=FIXTURES_DIR / "environments.jsonl")
    with pytest.raises(EnvError, match="not in"):
        make_env("envscaler").reset(Task(task_id="ghost", env="envscaler", split="train", prompt="?"))


def _public_release_rows() -> dict[str, list[dict]]:
    """Fixture rows shaped like the public HF release (tools / init_config as JSON strings)."""
    envs = [json.loads(l) for l in (FIXTURES_DIR / "environments.jsonl").read_text().splitlines()]
    tasks = [json.loads(l) for l in (FIXTURES_DIR / "tasks.jsonl").read_text().splitlines()]
    for e in envs:
        e["tools"] = e["tools"] if isinstance(e["tools"], str) else json.dumps(e["tools"])
    for t in tasks:
        t["init_config"] = t["init_config"] if isinstance(t["init_config"], str) else json.dumps(t["init_config"])
    return {"me/envs": envs, "me/tasks": tasks, "me/inline": [{**envs[-1], **t} for t in tasks if t["env_id"] == "env_bank"]}


def test_hf_dataset_ids_load_through_datasets(monkeypatch):
    rows, asked = _public_release_rows(), []

    def load_dataset(name, split):
        asked.append((name, split))
        if name not in rows:
            raise FileNotFoundError(f"Dataset {name} doesn't exist")
        return rows[name]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    e = make_env("envscaler", hf_dataset="me/tasks", hf_envs="me/envs")
    assert asked == [("me/tasks", "train"), ("me/envs", "train")] and len(all_tasks(e)) == 10
    assert play(e, all_tasks(e)["bank-002"], ORACLE["bank-002"]).reward == 1.0
    e.close()
    from huggingface_hub import HfApi  # a data_dir that is no folder is looked up on the hub once

    monkeypatch.setattr(HfApi, "dataset_info", lambda self, repo_id, **kw: asked.append(("hub", repo_id)))
    inline = make_env("envscaler", data_dir="me/inline")  # an owner/name data_dir that is no folder
    assert ("hub", "me/inline") in asked
    assert sorted(all_tasks(inline)) == ["bank-001", "bank-002", "bank-003"] and asked[-1] == ("me/inline", "train")
    with pytest.raises(EnvError, match="hf dataset 'me/missing': cannot load split 'train'"):
        make_env("envscaler", hf_dataset="me/missing")
    with pytest.raises(EnvError, match="not both"):
        make_env("envscaler", hf_dataset="me/tasks", data_dir=FIXTURES_DIR)


def test_lopd_bed_prompt_lists_tool_signatures_and_offers_no_schema_block():
    from stages.envs.envscaler import LopdBedEnv, tool_signature

    tool = {"type": "function", "function": {"name": "transfer", "description": "Move money.", "parameters": {
        "type": "object", "properties": {"src": {"type": "string"}, "amount": {"type": "number"}, "memo": {}},
        "required": ["src", "amount"]}}}
    assert tool_signature(tool) == "transfer(src: string, amount: number, memo?: any): Move money."
    with pytest.raises(EnvError, match="episode rules 'exact' compare with the state of a task's reference_actions"):
        LopdBedEnv(data_dir=FIXTURES_DIR)  # fixture tasks without reference actions
    bed = LopdBedEnv(data_dir=FIXTURES_DIR, episode_rules="lenient")
    task = bed.tasks("train", limit=1)[0]
    system, user = bed.reset(task)
    spec = bed.data.envs[bed.data.tasks[task.task_id].env_id]
    assert task.tools == "[]" and task.env == "lopd-bed" and user.content == bed.data.tasks[task.task_id].text
    assert [line[2:].split("(")[0] for line in system.content.splitlines() if "(" in line and line.startswith("- ")] \
        == spec.tool_names
    assert system.content.startswith(spec.introduction) and system.content.endswith('reply "Task Completed".')
    bed.close()


def test_unknown_split_names_the_environment_asked_for_and_its_splits():
    for name in ("envscaler", "lopd-bed"):  # lopd-bed is an envscaler subclass: named as the user typed it
        env = make_env(name, data_dir=FIXTURES_DIR, episode_rules="lenient")  # fixtures have no reference actions
        splits = ", ".join(sorted(env.data.splits))
        with pytest.raises(EnvError, match=f"^{name}: unknown split 'warm'; use one of: {splits}$"):
            env.tasks("warm")
        env.close()


def test_a_misspelt_env_gets_the_closest_name_and_the_registry_list():
    from stages.envs import env_names

    with pytest.raises(EnvError, match="unknown --env 'bfc'; did you mean 'bfcl'\\? choose one of: ") as err:
        make_env("bfc")
    assert str(err.value).endswith(", ".join(env_names())) and "lopd-bed" in env_names()
    with pytest.raises(EnvError, match="unknown --env 'zzz'; choose one of: "):
        make_env("zzz")
