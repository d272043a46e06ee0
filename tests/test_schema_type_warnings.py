"""Tool schemas with parameter types nobody knows are loaded with one warning that names them."""
from __future__ import annotations

import json
import logging
import shutil

import pytest

from stages.core.text.toolcalls import unknown_schema_types
from stages.envs import make_env
from stages.envs._bfcl_files import package_data_dir


def test_unknown_schema_types_walks_properties_items_and_unions():
    schema = {"type": "object", "properties": {
        "q": {"type": "quaternion"},
        "pts": {"type": "array", "items": {"type": "vec3"}},
        "opt": {"type": ["string", "null"]},
        "bad_union": {"type": ["string", "tensor"]},
        "nested": {"type": "object", "properties": {"deep": {"type": 7}}},
        "untyped": {"description": "no type: not reported"},
    }}
    assert unknown_schema_types(schema) == ["q: 'quaternion'", "pts[]: 'vec3'", "bad_union: 'tensor'", "nested.deep: 7"]
    assert unknown_schema_types({"type": "dict", "properties": {"x": {"type": "float"}}}, {"dict", "float"}) == []
    assert unknown_schema_types(None) == []


def _bfcl_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "unknown parameter type" in r.getMessage()]


def test_bfcl_single_turn_file_with_unknown_type_warns_once(tmp_path, caplog):
    (tmp_path / "possible_answer").mkdir()
    function = {"name": "rotate", "description": "d", "parameters": {"type": "dict", "properties": {
        "q": {"type": "quaternion", "description": "x"}, "axis": {"type": "array", "items": {"type": "vec3"}},
        "angle": {"type": "float"}}}}
    entries = [{"id": f"simple_{i}", "question": [[{"role": "user", "content": "rotate"}]], "function": [function]}
               for i in (0, 2)]  # both train ids (simple_1 is held out)
    (tmp_path / "BFCL_v3_simple.json").write_text("".join(json.dumps(e) + "\n" for e in entries))
    (tmp_path / "possible_answer" / "BFCL_v3_simple.json").write_text(
        "".join(json.dumps({"id": e["id"], "ground_truth": [{"rotate": {"q": [1]}}]}) + "\n" for e in entries))
    with caplog.at_level(logging.WARNING):
        tasks = make_env("bfcl", data_dir=tmp_path, categories=["simple"]).tasks("train")
    assert len(tasks) == 2
    warnings = _bfcl_warnings(caplog)
    assert len(warnings) == 1
    assert "BFCL_v3_simple.json" in warnings[0] and "entry simple_0, tool 'rotate', parameter q: 'quaternion'" in warnings[0]
    assert "parameter axis[]: 'vec3'" in warnings[0] and "angle" not in warnings[0]
    assert json.loads(tasks[0].tools)[0]["function"]["parameters"]["properties"]["q"]["type"] == "string"


def test_bfcl_package_data_loads_without_type_warnings(caplog):
    with caplog.at_level(logging.WARNING):
        make_env("bfcl").tasks("train")
        make_env("bfcl", categories=["base"]).tasks("test")
    assert _bfcl_warnings(caplog) == []


def test_bfcl_multi_turn_doc_with_unknown_type_warns_once(tmp_path, caplog):
    pytest.importorskip("bfcl")
    from bfcl.constant import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    source = package_data_dir()
    name = "BFCL_v3_multi_turn_base.json"
    entry = json.loads((source / name).read_text().splitlines()[0])
    (tmp_path / name).write_text(json.dumps(entry) + "\n")
    (tmp_path / "possible_answer").mkdir()
    (tmp_path / "possible_answer" / name).write_text((source / "possible_answer" / name).read_text().splitlines()[0] + "\n")
    shutil.copytree(source / "multi_turn_func_doc", tmp_path / "multi_turn_func_doc")
    doc_file = tmp_path / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING["GorillaFileSystem"]
    docs = [json.loads(line) for line in doc_file.read_text().splitlines() if line.strip()]
    cd = next(d for d in docs if d["name"] == "cd")
    cd["parameters"]["properties"]["folder"]["type"] = "quaternion"
    doc_file.write_text("".join(json.dumps(d) + "\n" for d in docs))
    with caplog.at_level(logging.WARNING):
        make_env("bfcl", data_dir=tmp_path, categories=["base"]).tasks("test")
    warnings = _bfcl_warnings(caplog)
    assert len(warnings) == 1
    assert doc_file.name in warnings[0] and "tool 'cd', parameter folder: 'quaternion'" in warnings[0]


def test_envscaler_tool_with_unknown_type_warns_once(tmp_path, caplog):
    from stages.envs.envscaler_data import FIXTURES_DIR

    envs = [json.loads(line) for line in (FIXTURES_DIR / "environments.jsonl").read_text().splitlines() if line.strip()]
    envs[0]["tools"][0]["function"]["parameters"]["properties"]["query"]["type"] = "quaternion"
    (tmp_path / "environments.jsonl").write_text("".join(json.dumps(e) + "\n" for e in envs))
    shutil.copy(FIXTURES_DIR / "tasks.jsonl", tmp_path / "tasks.jsonl")
    with caplog.at_level(logging.WARNING):
        make_env("envscaler", data_dir=tmp_path).tasks("train")
    warnings = [r.getMessage() for r in caplog.records if "unknown JSON-schema type" in r.getMessage()]
    assert len(warnings) == 1
    tool = envs[0]["tools"][0]["function"]["name"]
    assert "environments.jsonl" in warnings[0]
    assert f"env {envs[0]['env_id']}, tool {tool!r}, parameter query: 'quaternion'" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        make_env("envscaler").tasks("train")  # the bundled fixtures use known types only
    assert not [r for r in caplog.records if "unknown JSON-schema type" in r.getMessage()]
