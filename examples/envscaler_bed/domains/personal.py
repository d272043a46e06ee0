"""Personal-organiser environments of the lopd study bed (stdlib only), role "warmup".

A notes app, a to-do list and a contacts book. Their tasks only teach the ``<tool_call>`` format
in the supervised warm start: simple, varied, one or two calls each. See ``ENVS`` at the end.
"""
from __future__ import annotations

import random

from domains._common import (call as _call, check as _check, tool as _tool,
                             report_tool as _report_tool)

FIRST = ["Ada", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jin", "Kai", "Lena", "Mo", "Nia",
         "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vic", "Wes", "Yara", "Zoe"]
LAST = ["Moreno", "Okafor", "Lind", "Sato", "Novak", "Reyes", "Kaur", "Berg", "Costa", "Haddad", "Park", "Silva"]
DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


def _ids(rng: random.Random, prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{k}" for k in rng.sample(range(10, 100), n)]


def _added(table: str, item: str, **fields: object) -> dict:
    """A check that ``table`` holds an entry with exactly ``fields`` that was not there initially."""
    return _check(item, f"any(v == {fields!r} and k not in initial_state[{table!r}] "
                        f"for k, v in final_state[{table!r}].items())")


NEW_ID = '''
    def _new_id(self, table, prefix):
        return prefix + "-" + str(1 + max([int(k.split("-")[1]) for k in table] + [100]))
'''

# ----------------------------------------------------------------------------- notes

NOTES_CODE = '''
class NotesApp:
    def __init__(self, init_config: dict):
        self.notes = {}
''' + NEW_ID + '''
    def find_notes(self, query: str) -> dict:
        q = str(query).lower()
        return {"success": True, "data": [dict(n, note_id=k) for k, n in sorted(self.notes.items())
                                          if q in n["title"].lower()]}

    def add_note(self, title: str, text: str) -> dict:
        if not isinstance(title, str) or not title.strip() or not isinstance(text, str):
            return {"success": False, "error": "title and text must be non-empty strings"}
        note_id = self._new_id(self.notes, "N")
        self.notes[note_id] = {"title": title, "text": text}
        return {"success": True, "data": {"note_id": note_id}}

    def delete_note(self, note_id: str) -> dict:
        if note_id not in self.notes:
            return {"success": False, "error": f"no note {note_id}"}
        del self.notes[note_id]
        return {"success": True, "data": note_id}
'''
NOTES_REPORT = _report_tool("notes", "note_id", "note")  # an extra tool no task needs

NOTES = [("Groceries", "milk, eggs, rice"), ("Gym plan", "legs on Monday"), ("Gift ideas", "a scarf for Mum"),
         ("Books", "read Dune next"), ("Trip", "pack the charger"), ("Recipes", "try lentil soup"),
         ("Passwords hint", "the blue notebook"), ("Garden", "water the basil"), ("Car", "oil change in May"),
         ("Movies", "watch Alien"), ("Work", "send the report"), ("Budget", "rent is due on the 1st"),
         ("Birthdays", "Jin on 4 June"), ("Plants", "repot the fern"), ("Call list", "ring the dentist")]


def _notes_task(rng: random.Random) -> dict:
    picked = rng.sample(NOTES, rng.randint(5, 7))
    ids = _ids(rng, "N", len(picked) - 2)
    notes = {i: {"title": t, "text": x} for i, (t, x) in zip(ids, picked)}
    new1, new2 = picked[-2], picked[-1]
    a = ids[0]
    gone = _check(f"Is note {a} deleted?", f"{a!r} not in final_state['notes']")
    add1 = _added("notes", f"Is there a new note '{new1[0]}'?", title=new1[0], text=new1[1])
    add2 = _added("notes", f"Is there a new note '{new2[0]}'?", title=new2[0], text=new2[1])
    kind = rng.randrange(5)
    if kind == 0:
        text = rng.choice([f"Add a note titled '{new1[0]}' with the text '{new1[1]}'.",
                           f"Create a note '{new1[0]}': {new1[1]}"])
        checks, ref = [add1], [_call("add_note", title=new1[0], text=new1[1])]
    elif kind == 1:
        text = rng.choice([f"Delete note {a}.", f"Remove note {a}; it is no longer needed."])
        checks, ref = [gone], [_call("delete_note", note_id=a)]
    elif kind == 2:
        text = rng.choice([f"Find my '{notes[a]['title']}' note and delete it.",
                           f"Delete the note titled '{notes[a]['title']}'."])
        checks, ref = [gone], [_call("find_notes", query=notes[a]["title"]), _call("delete_note", note_id=a)]
    elif kind == 3:
        text = f"Add two notes: '{new1[0]}' saying '{new1[1]}', and '{new2[0]}' saying '{new2[1]}'."
        checks = [add1, add2]
        ref = [_call("add_note", title=new1[0], text=new1[1]), _call("add_note", title=new2[0], text=new2[1])]
    else:
        text = f"Delete note {a} and add a note '{new1[0]}' with the text '{new1[1]}'."
        checks, ref = [gone, add1], [_call("delete_note", note_id=a), _call("add_note", title=new1[0], text=new1[1])]
    return {"init_config": {"notes": notes}, "task": text, "checklist_with_func": checks, "reference_actions": ref}


# ----------------------------------------------------------------------------- to-do list

TODO_CODE = '''
class TodoList:
    def __init__(self, init_config: dict):
        self.todos = {}
''' + NEW_ID + '''
    def list_todos(self) -> dict:
        return {"success": True, "data": [dict(t, todo_id=k) for k, t in sorted(self.todos.items())]}

    def add_todo(self, text: str, due: str) -> dict:
        if not isinstance(text, str) or not text.strip():
            return {"success": False, "error": "text must be a non-empty string"}
        if due not in ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"):
            return {"success": False, "error": "due must be a weekday such as Mon"}
        todo_id = self._new_id(self.todos, "T")
        self.todos[todo_id] = {"text": text, "due": due, "done": False}
        return {"success": True, "data": {"todo_id": todo_id}}

    def complete_todo(self, todo_id: str) -> dict:
        t = self.todos.get(todo_id)
        if t is None:
            return {"success": False, "error": f"no to-do {todo_id}"}
        t["done"] = True
        return {"success": True, "data": dict(t, todo_id=todo_id)}
'''
TODO_REPORT = _report_tool("todos", "todo_id", "to-do item")  # an extra tool no task needs

TODOS = ["buy stamps", "pay the gas bill", "book a haircut", "return library books", "clean the oven",
         "call the bank", "renew passport", "fix the bike", "email the landlord", "order printer ink",
         "walk the dog", "back up photos", "defrost the freezer", "mail the parcel", "buy a birthday card"]


def _todo_task(rng: random.Random) -> dict:
    picked = rng.sample(TODOS, rng.randint(5, 7))
    ids = _ids(rng, "T", len(picked) - 1)
    todos = {i: {"text": x, "due": rng.choice(DAYS), "done": rng.random() < 0.3} for i, x in zip(ids, picked)}
    open_ids = [i for i in ids if not todos[i]["done"]] or ids[:1]
    todos[open_ids[0]]["done"] = False
    a = open_ids[0]
    new, due = picked[-1], rng.choice(DAYS)
    done_a = _check(f"Is {a} done?", f"final_state['todos'][{a!r}] == dict({todos[a]!r}, done=True)")
    added = _added("todos", f"Is '{new}' added, due {due}?", text=new, due=due, done=False)
    kind = rng.randrange(5)
    if kind == 0:
        text = rng.choice([f"Add a to-do '{new}' due {due}.", f"Remind me to {new}; due {due}."])
        checks, ref = [added], [_call("add_todo", text=new, due=due)]
    elif kind == 1:
        text = rng.choice([f"Mark to-do {a} as done.", f"I finished {a}. Complete it."])
        checks, ref = [done_a], [_call("complete_todo", todo_id=a)]
    elif kind == 2:
        text = rng.choice([f"I did '{todos[a]['text']}'. Mark it done.", f"Complete the to-do '{todos[a]['text']}'."])
        checks, ref = [done_a], [_call("list_todos"), _call("complete_todo", todo_id=a)]
    elif kind == 3 and len(open_ids) > 1:
        b = open_ids[1]
        done_b = _check(f"Is {b} done?", f"final_state['todos'][{b!r}] == dict({todos[b]!r}, done=True)")
        text = rng.choice([f"Mark to-dos {a} and {b} as done.", f"Complete {a} and {b}."])
        checks, ref = [done_a, done_b], [_call("complete_todo", todo_id=a), _call("complete_todo", todo_id=b)]
    else:
        text = f"Complete to-do {a} and add '{new}' due {due}."
        checks, ref = [done_a, added], [_call("complete_todo", todo_id=a), _call("add_todo", text=new, due=due)]
    return {"init_config": {"todos": todos}, "task": text, "checklist_with_func": checks, "reference_actions": ref}


# ----------------------------------------------------------------------------- contacts

CONTACTS_CODE = '''
class ContactsBook:
    def __init__(self, init_config: dict):
        self.contacts = {}
''' + NEW_ID + '''
    def find_contact(self, name: str) -> dict:
        q = str(name).lower()
        return {"success": True, "data": [dict(c, contact_id=k) for k, c in sorted(self.contacts.items())
                                          if q in c["name"].lower()]}

    def add_contact(self, name: str, phone: str) -> dict:
        if not isinstance(name, str) or not name.strip() or not isinstance(phone, str):
            return {"success": False, "error": "name and phone must be strings"}
        contact_id = self._new_id(self.contacts, "C")
        self.contacts[contact_id] = {"name": name, "phone": phone}
        return {"success": True, "data": {"contact_id": contact_id}}

    def update_phone(self, contact_id: str, phone: str) -> dict:
        c = self.contacts.get(contact_id)
        if c is None or not isinstance(phone, str):
            return {"success": False, "error": f"no contact {contact_id}"}
        c["phone"] = phone
        return {"success": True, "data": dict(c, contact_id=contact_id)}
'''
CONTACTS_REPORT = _report_tool("contacts", "contact_id", "contact")  # an extra tool no task needs


def _contacts_task(rng: random.Random) -> dict:
    n = rng.randint(4, 6)
    names = [f"{f} {rng.choice(LAST)}" for f in rng.sample(FIRST, n + 1)]
    phones = [f"555-{rng.randint(1000, 9999)}" for _ in range(n + 2)]
    ids = _ids(rng, "C", n)
    contacts = {i: {"name": nm, "phone": ph} for i, nm, ph in zip(ids, names, phones)}
    a, new_name, new_phone, phone = ids[0], names[n], phones[n], phones[n + 1]
    updated = _check(f"Is {a}'s phone {phone}?", f"final_state['contacts'][{a!r}] == dict({contacts[a]!r}, phone={phone!r})")
    added = _added("contacts", f"Is {new_name} added with {new_phone}?", name=new_name, phone=new_phone)
    kind = rng.randrange(5)
    if kind == 0:
        text = rng.choice([f"Add {new_name} to my contacts, phone {new_phone}.",
                           f"Save a new contact: {new_name}, {new_phone}."])
        checks, ref = [added], [_call("add_contact", name=new_name, phone=new_phone)]
    elif kind == 1:
        text = rng.choice([f"Change the phone of contact {a} to {phone}.", f"Contact {a} has a new number: {phone}."])
        checks, ref = [updated], [_call("update_phone", contact_id=a, phone=phone)]
    elif kind == 2:
        first = contacts[a]["name"]
        text = rng.choice([f"{first} got a new phone number, {phone}. Update it.",
                           f"Find {first} in my contacts and set the phone to {phone}."])
        checks, ref = [updated], [_call("find_contact", name=first), _call("update_phone", contact_id=a, phone=phone)]
    elif kind == 3:
        text = f"Update contact {a} to phone {phone} and add {new_name} with phone {new_phone}."
        checks = [updated, added]
        ref = [_call("update_phone", contact_id=a, phone=phone), _call("add_contact", name=new_name, phone=new_phone)]
    else:
        text = rng.choice([f"What is the phone number of {contacts[a]['name']}? Add it as a new contact "
                           f"'{new_name}' too, since they share a line.",
                           f"{new_name} shares a line with {contacts[a]['name']}. Look it up and save "
                           f"{new_name} with that number."])
        added = _added("contacts", f"Is {new_name} added with {contacts[a]['phone']}?", name=new_name,
                       phone=contacts[a]["phone"])
        checks = [added]
        ref = [_call("find_contact", name=contacts[a]["name"]),
               _call("add_contact", name=new_name, phone=contacts[a]["phone"])]
    return {"init_config": {"contacts": contacts}, "task": text, "checklist_with_func": checks,
            "reference_actions": ref}


ENVS = [
    {
        "env_id": "bed_personal_notes",
        "env_class_name": "NotesApp",
        "role": "warmup",
        "environment_introduction": "A notes app: notes with an id, title and text.",
        "constraints_rules": [],
        "tools": [_tool("find_notes", "Notes whose title contains the query.", query="string"),
                  _tool("add_note", "Add a note; returns its id.", title="string", text="string"),
                  _tool("delete_note", "Delete a note.", note_id="string"), NOTES_REPORT[1]],
        "env_class_code": NOTES_CODE + NOTES_REPORT[0],
        "make_task": _notes_task,
    },
    {
        "env_id": "bed_personal_todo",
        "env_class_name": "TodoList",
        "role": "warmup",
        "environment_introduction": "A to-do list: items with an id, text, due weekday (Mon-Sun) and done flag.",
        "constraints_rules": [],
        "tools": [_tool("list_todos", "All to-do items."),
                  _tool("add_todo", "Add an item; returns its id.", text="string", due="string"),
                  _tool("complete_todo", "Mark an item done.", todo_id="string"), TODO_REPORT[1]],
        "env_class_code": TODO_CODE + TODO_REPORT[0],
        "make_task": _todo_task,
    },
    {
        "env_id": "bed_personal_contacts",
        "env_class_name": "ContactsBook",
        "role": "warmup",
        "environment_introduction": "A contacts book: contacts with an id, name and phone.",
        "constraints_rules": [],
        "tools": [_tool("find_contact", "Contacts whose name contains the text.", name="string"),
                  _tool("add_contact", "Add a contact; returns its id.", name="string", phone="string"),
                  _tool("update_phone", "Change a contact's phone.", contact_id="string", phone="string"),
                  CONTACTS_REPORT[1]],
        "env_class_code": CONTACTS_CODE + CONTACTS_REPORT[0],
        "make_task": _contacts_task,
    },
]
