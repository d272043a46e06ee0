"""Write the own-environment example's ``environments.jsonl`` and ``tasks.jsonl`` (docs/own-environment.md).

    python examples/own_env/make.py

One environment (``todo``: the class in ``todo_env.py``, three tools) and eight tasks, each with its
initial state, check functions and reference actions: six ``train``, two ``test``. Stdlib only; the
output is the same on every run.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def tool(name: str, description: str, **params: str) -> dict[str, Any]:
    """An OpenAI-style function schema; every parameter is a required string described by its value."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {p: {"type": "string", "description": d} for p, d in params.items()},
                       "required": list(params)}}}


ENV = {
    "env_id": "todo",
    "env_class_name": "TodoList",
    "env_class_code": (HERE / "todo_env.py").read_text(encoding="utf-8"),
    "environment_introduction": "A personal to-do list. Items have an id (T-1, T-2, ...), a title and a done flag.",
    "constraints_rules": ["Change only the items the user names.", "Look items up by title with list_items before using their id."],
    "tools": [
        tool("list_items", "List every item with its id, title and done flag."),
        tool("add_item", "Add an open item.", title="the item's title"),
        tool("complete_item", "Mark an open item done.", item_id="the item's id, e.g. T-1"),
    ],
}

LIST_A = {"items": {"T-1": {"title": "Buy milk", "done": False}, "T-2": {"title": "Pay rent", "done": False},
                    "T-3": {"title": "Book dentist", "done": True}}, "next_id": 4}
LIST_B = {"items": {"T-1": {"title": "Water the plants", "done": False}, "T-2": {"title": "Renew passport", "done": False},
                    "T-3": {"title": "Call grandma", "done": False}, "T-4": {"title": "Fix the bike", "done": True}},
          "next_id": 5}


def check(item: str, expr: str) -> dict[str, str]:
    """One checklist entry: ``check_func(final_state)`` returns ``expr`` (``initial_state`` is a global)."""
    return {"check_item": item, "check_func": f"def check_func(final_state):\n    return {expr}\n"}


def done(item_id: str) -> dict[str, str]:
    """Item ``item_id`` is done."""
    return check(f"Is {item_id} done?", f"final_state['items'][{item_id!r}]['done'] is True")


def only_done(item_id: str) -> dict[str, str]:
    """Every item but ``item_id`` is as it was (no item added or removed)."""
    others = lambda state: f"{{k: v for k, v in {state}['items'].items() if k != {item_id!r}}}"
    return check("Is every other item as it was?", f"{others('final_state')} == {others('initial_state')}")


def added(title: str) -> dict[str, str]:
    """An open item titled ``title`` is on the list."""
    return check(f"Is {title!r} on the list, open?",
                 f"any(i['title'] == {title!r} and not i['done'] for i in final_state['items'].values())")


def kept() -> dict[str, str]:
    """Every item of the initial state is as it was."""
    return check("Are the earlier items as they were?",
                 "all(final_state['items'].get(k) == v for k, v in initial_state['items'].items())")


def call(name: str, **arguments: str) -> dict[str, Any]:
    """One reference action."""
    return {"name": name, "arguments": arguments}


# (task_id, split, initial state, task text, checks, reference actions)
TASKS = [
    ("todo-01", "train", LIST_A, "Mark 'Buy milk' as done.", [done("T-1"), only_done("T-1")],
     [call("list_items"), call("complete_item", item_id="T-1")]),
    ("todo-02", "train", LIST_A, "Add 'Call the plumber' to my to-do list.", [added("Call the plumber"), kept()],
     [call("add_item", title="Call the plumber")]),
    ("todo-03", "train", LIST_B, "Item T-2 is finished; tick it off.", [done("T-2"), only_done("T-2")],
     [call("complete_item", item_id="T-2")]),
    ("todo-04", "train", LIST_B, "Mark 'Call grandma' as done and put 'Buy stamps' on the list.",
     [done("T-3"), added("Buy stamps")],
     [call("list_items"), call("complete_item", item_id="T-3"), call("add_item", title="Buy stamps")]),
    ("todo-05", "train", LIST_A, "I paid the rent. Tick it off and add 'File taxes'.", [done("T-2"), added("File taxes")],
     [call("list_items"), call("complete_item", item_id="T-2"), call("add_item", title="File taxes")]),
    ("todo-06", "train", LIST_B, "Add two items: 'Buy bread' and 'Clean the gutters'.",
     [added("Buy bread"), added("Clean the gutters"), kept()],
     [call("add_item", title="Buy bread"), call("add_item", title="Clean the gutters")]),
    ("todo-07", "test", LIST_A, "Add 'Walk the dog' to my list.", [added("Walk the dog"), kept()],
     [call("add_item", title="Walk the dog")]),
    ("todo-08", "test", LIST_B, "Tick off 'Renew passport'.", [done("T-2"), only_done("T-2")],
     [call("list_items"), call("complete_item", item_id="T-2")]),
]


def rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The environment rows and the task rows."""
    tasks = [{"task_id": tid, "env_id": ENV["env_id"], "split": split, "init_config": init, "task": text,
              "checklist_with_func": checks, "reference_actions": refs}
             for tid, split, init, text, checks, refs in TASKS]
    return [ENV], tasks


def jsonl(items: list[dict[str, Any]]) -> str:
    """One JSON object per line."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in items)


if __name__ == "__main__":
    envs, tasks = rows()
    (HERE / "environments.jsonl").write_text(jsonl(envs), encoding="utf-8")
    (HERE / "tasks.jsonl").write_text(jsonl(tasks), encoding="utf-8")
    print(f"wrote 1 environment and {len(tasks)} tasks to {HERE}")
