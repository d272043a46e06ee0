"""A to-do list: the environment class of the own-environment example (docs/own-environment.md).

``make.py`` ships this file's text as the ``env_class_code`` of ``environments.jsonl``. lopd runs it
in an isolated worker process: ``TodoList(init_config)``, then every ``init_config`` key set as an
attribute; each tool call is ``getattr(instance, name)(**arguments)``; the checks read
``vars(instance)``. Stdlib only.
"""
from typing import Dict


class TodoList:
    """To-do items (title, done) keyed by id ("T-1", ...); ``next_id`` numbers the next new item."""

    def __init__(self, init_config: dict):
        self.items: Dict[str, dict] = {}
        self.next_id: int = 1

    def list_items(self) -> dict:
        """Every item with its id."""
        return {"success": True, "data": [dict(item, item_id=k) for k, item in self.items.items()]}

    def add_item(self, title: str) -> dict:
        """Add an open item; refused for an empty title or one already open."""
        title = str(title).strip()
        if not title:
            return {"success": False, "error": "title is empty"}
        if any(i["title"] == title and not i["done"] for i in self.items.values()):
            return {"success": False, "error": f"{title!r} is already on the list"}
        item_id = f"T-{self.next_id}"
        self.items[item_id] = {"title": title, "done": False}
        self.next_id += 1
        return {"success": True, "data": {"item_id": item_id}}

    def complete_item(self, item_id: str) -> dict:
        """Mark an open item done; refused for an unknown id or an item already done."""
        if item_id not in self.items:
            return {"success": False, "error": f"unknown item {item_id}"}
        if self.items[item_id]["done"]:
            return {"success": False, "error": f"item {item_id} is already done"}
        self.items[item_id]["done"] = True
        return {"success": True, "data": {"item_id": item_id, "done": True}}
