"""ACEBench's checkers of its single-turn categories: "normal" (the reply's calls against the answer's,
an AST match) and "special" (the reply must name what is missing or wrong, string rules).

Follows ACEBench/ACEBench at e6db74b: ``normal_single_turn_eval`` / ``special_eval`` in eval_main.py,
``normal_checker``, ``simple_function_checker``, ``type_checker``, ``string_checker``,
``list_checker``, ``dict_checker`` and ``list_dict_checker`` in model_eval/checker.py, and
``standardize_string``, ``find_description`` in model_eval/utils.py. Its rules, quirks included,
are kept because a number reported under ACEBench's name must be ACEBench's number:

* the reply loses all whitespace (inside strings too) before it is read, and must then be one list
  of calls with keyword arguments;
* the reply has as many calls as the answer, with the same names as often (a ``_<digits>`` suffix
  of an answer key is dropped); each answer call is met by some reply call of that name;
* every required parameter is given; a parameter the answer leaves out must not be given;
* types: the declared type, or else the answer value's type (then the value is not compared);
  ``"true"`` / ``"false"`` count as booleans; an integer counts as a float;
* values: strings by containment after standardising (case, spaces and ``,./-_*^`` dropped) --
  the answer's string inside the reply's; lists of strings equal after standardising, in order;
  objects with the answer's number of keys, each value's text containing the answer's; numbers
  and booleans outside objects are not compared at all (only their type), as upstream;
* special: "Missing necessary parameters" plus the function's name and each missing parameter
  (incomplete), "There is incorrect value" plus each wrong value (error_param), "the limitations
  of the function" (irrelevant), each checked on the reply text as given.

Differences from ACEBench's code: the reply is read by lopd's
linear-time reader (:func:`stages.core.text.pycall_reader.read_call_list`, never ``eval``), so a bare
name as a value (ACEBench: the name as a string), a positional argument (ACEBench: dropped), an
expression such as ``1+2`` (ACEBench: evaluated), a call as a value, or calls without the outer
brackets make the reply unreadable, and ``null`` / ``true`` / ``false`` are literals; a
``<think>`` block is dropped before checking; where ACEBench's code would crash, a type name its
table lacks, a function without ``parameters`` and an ``objectArray`` parameter fail the call, and
a function without ``required`` requires nothing.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

from stages.core.text.pycall_reader import PyCallError, read_call_list
from stages.core.text.toolcalls import strip_thinking

NORMAL = ("normal_single_turn_single_function", "normal_single_turn_parallel_function",
          "normal_multi_turn_user_adjust", "normal_multi_turn_user_switch", "normal_similar_api",
          "normal_preference", "normal_atom_bool", "normal_atom_enum", "normal_atom_number", "normal_atom_list",
          "normal_atom_object_deep", "normal_atom_object_short")
"""ACEBench's 12 normal categories (``ACE_DATA_CATEGORY["normal"]`` in category.py)."""
SPECIAL = ("special_incomplete", "special_error_param", "special_irrelevant")
"""ACEBench's 3 special categories (``ACE_DATA_CATEGORY["special"]``)."""


class _NoValueType:
    """The type ACEBench gives the type name "enum" (``enumerate``): no value read from a reply has it."""


# PYTHON_TYPE_MAPPING and PYTHON_NESTED_TYPE_CHECK_LIST of model_eval/checker.py
_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list,
                           "tuple": list, "dict": dict, "any": str, "list": list, "object": dict,
                           "objectArray": list, "list(string)": list, "list(enum)": list, "int": int,
                           "enum": _NoValueType, "number": int}
_NESTED = ("array", "tuple", "list(string)", "list(enum)", "object", "objectArray")
_STANDARDISE = re.compile(r"[ ,./\-_*^]")
_SUFFIX = re.compile(r"_\d+$")


Verdict = dict[str, Any]
"""A check's outcome: ``valid`` (bool), ``error_type`` and ``error`` (str, empty when valid)."""


def _ok() -> Verdict:
    return {"valid": True, "error_type": "", "error": ""}


def _fail(error_type: str, error: str) -> Verdict:
    return {"valid": False, "error_type": error_type, "error": error}


def standardise(text: str) -> str:
    """ACEBench's ``standardize_string`` (model_eval/utils.py): spaces and ``,./-_*^`` removed,
    lower case, single quotes made double."""
    return _STANDARDISE.sub("", text).lower().replace("'", '"')


def decode_reply(reply: str) -> list[dict[str, dict[str, Any]]] | None:
    """The calls of a normal-category reply as ACEBench decodes them (``decode_ast`` on the reply
    with all whitespace removed, normal_single_turn_eval in eval_main.py).

    Args:
        reply: the model's text (a ``<think>`` block is dropped first).

    Returns:
        ``[{function name: {argument: value}}, ...]`` in reply order, or None when the reply is not
        one bracketed list of keyword calls with literal values. Never raises for a ``str``.
    """
    body = "".join(strip_thinking(reply).split())
    if len(body) < 2 or body[0] != "[" or body[-1] != "]":
        return None
    try:
        return [{name: args} for name, args in read_call_list(body[1:-1], 0, bare=True)]
    except PyCallError:  # includes PySyntaxError
        return None


def find_description(functions: list[dict[str, Any]], answer_key: str) -> dict[str, Any] | None:
    """ACEBench's ``find_description``: the first function whose name is contained in ``answer_key``
    (the answer's key as written, suffix included), None when there is none."""
    return next((f for f in functions if isinstance(f, dict) and str(f.get("name")) in answer_key), None)


def check_normal(functions: list[dict[str, Any]], calls: list[dict[str, dict[str, Any]]],
                 answer: dict[str, Any]) -> Verdict:
    """One answer candidate against the reply's calls: ACEBench's ``normal_checker`` (model_eval/checker.py).

    Args:
        functions: the task's function descriptions.
        calls: the decoded reply (:func:`decode_reply`).
        answer: one ground-truth candidate, ``{function name (maybe with _<n>): {param: value}}``.

    Returns:
        The verdict; ``error_type`` as ACEBench names it (``wrong functions number``,
        ``function_mismatch``, ``lack_args``, ``addition_args``, ``type_error``, ``value_error...``).
    """
    if len(calls) != len(answer):
        return _fail("wrong functions number", "The number of functions does not match the answer.")
    wanted = [(_SUFFIX.sub("", key), key, params) for key, params in answer.items()]
    have = Counter(name for call in calls for name in call)
    want = Counter(name for name, _, _ in wanted)
    for name in list(have) + list(want):
        if name not in want or name not in have:
            return _fail("function_mismatch", f"extra function detected: {name} is not in the ground truth")
        if have[name] != want[name]:
            return _fail("function_mismatch", f"incorrect count for function {name}: "
                                              f"[expected: {want[name]}, actual: {have[name]}]")
    for name, key, params in wanted:
        description = find_description(functions, key)
        verdict = _fail("simple_function_checker:unclear", "wrong_function")
        for call in calls:
            if next(iter(call)) == name:
                verdict = _check_call(description, call, params)
                if verdict["valid"]:
                    break
        if not verdict["valid"]:
            return verdict
    return _ok()


def _check_call(description: dict[str, Any] | None, call: dict[str, dict[str, Any]],
                answer: dict[str, Any]) -> Verdict:
    """ACEBench's ``simple_function_checker`` for one reply call against one answer call."""
    schema = (description or {}).get("parameters", {})
    schema = schema if isinstance(schema, dict) else {}
    given = next(iter(call.values()))
    if given == {} and schema == {}:
        return _ok()
    if given == {} or schema == {}:
        return _fail("wrong_param", "")
    properties = schema.get("properties")
    if answer == properties:
        return _ok()
    if answer == {}:
        return _fail("wrong_param", "")
    func_name = str((description or {}).get("name"))
    if func_name not in call:
        return _fail("wrong_function_name", f"expected {func_name}, got {next(iter(call))}")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    for param in required if isinstance(required, list) else []:
        if param not in given:
            return _fail("lack_args", f"lack required_params: {param}")
    for param, value in given.items():
        if param not in properties or param not in answer:
            return _fail("addition_args", f"addition params: {param}")
        verdict = _check_param(param, value, answer[param], properties[param], func_name)
        if not verdict["valid"]:
            return verdict
    return _ok()


def _check_param(param: str, value: Any, want: Any, details: Any, func_name: str) -> Verdict:
    """One given parameter: its type (``type_checker``), then its value by the declared type."""
    declared = details.get("type") if isinstance(details, dict) else None
    expected = _TYPES.get(declared) if isinstance(declared, str) else None
    if expected is None:
        return _fail("type_error", f"parameter ({param}) of api ({func_name}) has a type ACEBench does not "
                                   f"know: {declared!r}")
    nested = None
    if declared in _NESTED:
        items = details.get("items")
        inner = items["type"] if isinstance(items, dict) and "type" in items else (
            "string" if "string" in declared else "enum" if "enum" in declared else "dict")
        nested = _TYPES.get(inner) if isinstance(inner, str) else None
        if nested is None:
            return _fail("type_error", f"parameter ({param}) of api ({func_name}) has an item type ACEBench "
                                       f"does not know: {inner!r}")
    if declared == "float" and type(value) is int:
        value = float(value)
    valid, variable = type_matches(value, want, expected, nested)
    if not valid:
        return _fail("type_error", f"wrong type for parameter ({param}) of api ({func_name}): "
                                   f"[expected: {expected.__name__}, got: {type(value).__name__}]")
    if variable:
        return _ok()
    wrong = f"wrong value for parameter ({param}) of api ({func_name}): [expected: {want}, got: {value}]"
    if expected is dict:
        return _ok() if dict_matches(value, want) else _fail("value_error", wrong)
    if expected is list and nested is dict:
        if declared == "objectArray":
            return _fail("value_error:dict_items", "objectArray parameters are not checkable (ACEBench crashes)")
        same = isinstance(want, list) and len(value) == len(want) and all(map(dict_matches, value, want))
        return _ok() if same else _fail("value_error:list_dict_count", wrong)
    if expected is str:
        return _ok() if standardise(want) in standardise(value) else _fail("value_error:string", wrong)
    if expected is list:
        return _ok() if _standard_list(value) == _standard_list(want) else _fail("value_error:list/tuple", wrong)
    return _ok()  # numbers and booleans: the type is the whole check upstream


def type_matches(value: Any, want: Any, expected: type, nested: type | None) -> tuple[bool, bool]:
    """ACEBench's ``type_checker``: returns (valid, is_variable).

    ``is_variable`` (the answer's value has another type than the declared one, so the value is
    not compared) is set when the answer is not ``""`` and its type differs from ``expected``. The
    value (``"true"`` / ``"false"`` read as booleans) passes when its type is ``expected`` (for a
    nested type: some answer item is no list, or every value item type-checks against it), or else
    when it has the answer's type or equals the answer (then it is a variable).
    """
    answer_type = None if _equal(want, "") else type(want)
    variable = answer_type is not None and answer_type != expected
    value = True if _equal(value, "true") else False if _equal(value, "false") else value
    if type(value) == expected:
        if nested is None:
            return True, variable
        for item in want if isinstance(want, (list, dict, str)) else ():
            if type(item) is not list or all(type_matches(v, item, nested, None)[0] for v in value):
                return True, variable
        return False, variable
    if answer_type is not None and (type(value) == answer_type or _equal(want, value)):
        return True, True
    return False, variable


def _equal(a: Any, b: Any) -> bool:
    return bool(a == b)


def dict_matches(value: Any, want: Any) -> bool:
    """ACEBench's ``dict_checker``: ``value`` is a dict with as many keys as ``want``, every key of it in
    ``want``; nested dicts recursively, other values by text: the (standardised, for strings) answer
    value's ``str`` contained in the reply value's (``"true"`` / ``"false"`` read as booleans)."""
    if not isinstance(value, dict) or not isinstance(want, dict) or len(value) != len(want):
        return False
    for key, have in value.items():
        have = True if _equal(have, "true") else False if _equal(have, "false") else have
        if key not in want:
            return False
        expected = want[key]
        if isinstance(expected, dict):
            if not dict_matches(have, expected):
                return False
            continue
        have = standardise(have) if type(have) is str else have
        expected = standardise(expected) if type(expected) is str else expected
        if str(expected) not in str(have):
            return False
    return True


def _standard_list(values: Any) -> list[Any]:
    """``list_checker``'s standardised list: strings standardised, other items as they are."""
    items = values if isinstance(values, (list, str, dict)) else []
    return [standardise(v) if type(v) is str else v for v in items]


def check_special(category: str, reply: str, answer: Any) -> Verdict:
    """ACEBench's ``special_eval`` (eval_main.py) on one reply.

    Args:
        category: ``special_incomplete``, ``special_error_param`` or ``special_irrelevant``.
        reply: the model's text (a ``<think>`` block is dropped first).
        answer: the ground truth: ``{function: [missing parameter, ...]}`` (incomplete),
            ``{parameter: [wrong value, ...]}`` (error_param); unused for irrelevant.

    Returns:
        The verdict: ``error_detection`` when the key phrase is missing, ``error_correction`` when
        a named function, parameter or value is.
    """
    text = strip_thinking(reply)
    if "irrelevant" in category:
        phrase = "the limitations of the function"
        return _ok() if phrase in text else _fail("error_detection", f"the reply lacks {phrase!r}")
    phrase = "Missing necessary parameters" if "incomplete" in category else "There is incorrect value"
    for name, values in answer.items():  # an empty answer passes, as upstream
        if phrase not in text:
            return _fail("error_detection", f"the reply lacks {phrase!r}")
        if "incomplete" in category and name not in text:
            return _fail("error_correction", f"the reply does not name {name}")
        for value in values:
            if value not in text:
                return _fail("error_correction", f"the reply does not name {value}")
    return _ok()
