"""`lopd distill --method X --help` lists method X's own options with their defaults (issue 31
item 4); every other help stays free of the methods (they import torch)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from lopd_cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def _help(*args: str) -> str:
    result = runner.invoke(app, ["distill", *args, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    return result.output


def test_help_of_a_method_lists_its_options_with_defaults():
    text = _help("--method", "grpo")
    assert "Options of method grpo (pass as -o KEY=VALUE):" in text
    assert "GRPO's options" in text  # the Options model's docstring
    for row in ("ppo_epochs: int", "(default 1)", "aggregation: token-mean | seq-mean | constant",
                "loss_constant: int | None", "drop_zero_var: bool"):
        assert row in text, row
    assert "--margin" in text  # the command's own help is all still there
    flat = " ".join(text.split())
    assert "(default true)" in flat and "(default True)" not in flat  # as -o takes it: JSON
    assert "(default 1.41421)" in " ".join(_help("--method", "skill-sd").split())  # ucb_c, 6 digits
    text = _help("--method=sdft")
    assert "Options of method sdft" in text and "teacher: frozen | ema | current" in text
    assert "the verified reference in the teacher's context" in " ".join(text.split())  # the model it extends
    assert "Token budget of the rendered reference. (default 1024)" in " ".join(text.split())  # per option
    for method in ("opsd", "sdpo", "skill-sd"):  # every option of every method carries its description
        from stages.methods import get_method

        for name, field in get_method(method).Options.model_fields.items():
            assert field.description, f"{method}: option {name} has no description"
    assert "Student top-k support" in " ".join(_help("--method", "sdpo").split())
    assert "Options of method" not in _help()
    assert "Options of method" not in _help("--method", "lopd")  # lopd's options are the flags above


def test_help_of_an_unknown_method_says_so_and_lists_the_known_ones():
    result = runner.invoke(app, ["distill", "--method", "nope", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "Options" not in result.output  # the error alone, not the whole help
    assert "--method nope: unknown method (known: grpo, lopd, lopd-text, opsd, sdft, sdpo, skill-sd" in result.output


def test_other_helps_do_not_import_the_methods():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom lopd_cli.main import app\n"
            "for args in (['--help'], ['report', '--help'], ['show', '--help']):\n"
            "    assert CliRunner().invoke(app, args).exit_code == 0\n"
            "print(sorted(m for m in ('torch', 'stages.methods') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stderr


def test_help_of_beta_says_what_values_near_its_endpoints_do():
    flat = " ".join(_help("--method", "opsd").split())
    assert "1 = reverse KL(S || T) (each endpoint is its own loss, not a limit)" in flat
    assert "near 0 or 1 about beta(1-beta) times the nearer endpoint's KL" in flat
