"""A command line `lopd` refuses (an unknown option, a bad value, a missing setting or file) is
refused before torch, transformers or lancedb load: the command's settings are checked first,
the training libraries load only once it runs. Checked in a fresh interpreter by the modules
loaded (the seconds themselves are in the report of issue 54, not asserted here)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stages.methods import get_method, known_methods, method_options
from stages.methods.options import METHOD_OPTIONS

ROOT = Path(__file__).resolve().parents[1]

REFUSED = [  # (command line, the start of its one error line)
    (["distill", "--dtype", "bf16"], "error: --env is required"),
    (["distill", "--env", "lopd-bed", "--composer", "c", "--dtype", "bf16"], "error: invalid option --dtype: did you mean 'bfloat16'?"),
    (["distill", "--env", "lopd-bed", "--margin", "-1", "--composer", "c"], "error: invalid option --margin"),
    (["distill", "--bogus"], "Error: No such option: --bogus"),
    (["distill", "--env", "lopd-bed"], "error: --composer is required by method 'lopd'"),
    (["distill", "--env", "lopd-bed", "--composer", "/nonexistent", "--store", "s", "--out", "o"],
     "error: /nonexistent/composer_config.json: no composer checkpoint (composer_config.json missing; "
     "`lopd coldstart --experiences STORE --out DIR` makes one in DIR/final)"),
    (["distill", "--env", "lopd-bed", "--composer", "k4", "--K", "8", "--store", "s", "--out", "o"],
     "error: k4/composer_config.json: field 'K' is 4, but the run asks for K=8 (K must match the cold-start composer)"),
    (["evaluate", "--bench", "bfcl_v3"], "error: invalid option --bench: did you mean 'bfcl-v3'?"),
    (["evaluate", "--bench", "lopd-bed", "--composer", "/nonexistent", "--store", "s"],
     "error: /nonexistent/composer_config.json: no composer checkpoint (composer_config.json missing; "
     "`lopd coldstart --experiences STORE --out DIR` makes one in DIR/final)"),
    (["evaluate", "--compare", "/nonexistent/a.json", "/nonexistent/b.json"], "error: /nonexistent/a.json: cannot read"),
    (["evaluate", "--bench", "lopd-bed", "--model", "/nonexistent", "--limit", "1"], "error: --model '/nonexistent': no such local folder"),
    (["coldstart", "--placement", "nope"], "error: invalid option --placement"),
    (["coldstart", "--experiences", "/nonexistent", "--out", "cs-out"], "error: no experience store at /nonexistent"),
    (["sft", "--source", "nope"], "error: invalid option --source"),
    (["sft", "--log", "mlflow"], "error: invalid option --log"),
    (["collect", "--env", "bfcl", "--dtype", "bf16"], "error: invalid option --dtype"),
    (["collect", "--env", "nope"], "error: unknown --env 'nope'"),
    (["index", "--field", "nope"], "error: invalid option --field"),
    (["show", "/nonexistent"], "error: /nonexistent: no such report or store"),
    (["export", "/nonexistent", "--out", "/nonexistent/x"], "error: /nonexistent: no such run folder"),
    (["report", "/nonexistent"], "error: /nonexistent: no such run folder"),
    (["study", "--config", "/nonexistent.toml"], "error: /nonexistent.toml: cannot read"),
    (["sft", "--store", "/nonexistent", "--out", "sft-out"], "error: no experience store at /nonexistent"),
    (["store", "versions", "--store", "/nonexistent"], "error: no experience store at /nonexistent"),
]

_CODE = """
import json, sys
from typer.testing import CliRunner
from lopd_cli.main import app
results = []
for args in json.loads(sys.argv[1]):
    result = CliRunner().invoke(app, args)
    results.append([result.exit_code, [l for l in result.output.splitlines() if l.strip()]])
print(json.dumps({"results": results, "loaded": sorted(m for m in ("torch", "transformers", "lancedb", "peft")
                                                        if m in sys.modules)}))
"""


def test_refused_command_lines_load_no_model_library(tmp_path):
    (tmp_path / "k4").mkdir()
    (tmp_path / "k4" / "composer_config.json").write_text('{"K": 4}')  # a composer of another K
    out = subprocess.run([sys.executable, "-c", _CODE, json.dumps([args for args, _ in REFUSED])], cwd=tmp_path,
                         capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    seen = json.loads(out.stdout.splitlines()[-1])
    for (args, start), (code, lines) in zip(REFUSED, seen["results"]):
        assert code == 2, (args, lines)
        assert any(line.startswith(start) for line in lines), (args, lines)
    assert seen["loaded"] == [], out.stderr


def test_every_method_s_options_are_its_class_s():
    """The options the CLI reads without torch are the ones each method trains with."""
    # every built-in method's options are listed; a method registered elsewhere (a test's toy) uses its class's
    built_in = {name for name in known_methods() if get_method(name).__module__.startswith("stages.methods.")}
    assert set(METHOD_OPTIONS) == built_in
    for name in known_methods():
        assert method_options(name) is get_method(name).Options
        assert name not in METHOD_OPTIONS or METHOD_OPTIONS[name] is get_method(name).Options


@pytest.mark.parametrize("args,flag", [(["distill", "--learning-rate", "1e-4"], "--lr"),
                                       (["distill", "--num-generations", "4"], "--group-size"),
                                       (["distill", "--bf16"], "--dtype bfloat16"),
                                       (["coldstart", "--learning_rate", "1e-4"], "--lr"),
                                       (["plan", "--model", "qwen3-4b", "--fp16"], "--dtype float16")])
def test_another_trainer_s_option_name_gets_the_command_s_flag(args, flag):
    from typer.testing import CliRunner

    from lopd_cli.main import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    unknown = next(a for a in args[1:] if a.startswith("--") and a != "--model")
    assert result.output.strip().splitlines()[-1] == f"Error: No such option: {unknown} (Possible options: {flag})"
