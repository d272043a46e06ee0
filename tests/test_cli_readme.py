"""The flag tables of the stage pages (docs/stages/<stage>.md) are made from the CLI
(:mod:`lopd_cli.flag_tables`), so they cannot drift apart; the CLI's flags are its settings' fields."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from lopd_cli import flag_tables
from lopd_cli.flag_tables import flag_table
from lopd_cli.main import app

STAGES = Path(__file__).resolve().parents[1] / "docs" / "stages"
COMMANDS = typer.main.get_command(app).commands


def _section(name: str) -> str:
    page = STAGES / f"{name}.md"
    assert page.exists(), f"docs/stages has no page for `lopd {name}`"
    return page.read_text()


@pytest.mark.parametrize("name", sorted(n for n in COMMANDS if n != "store"))
def test_every_command_s_page_holds_its_generated_flag_table(name):
    """A page's flag table is made from the command (`python -m lopd_cli.flag_tables`): every flag
    has a row, with its default and help as `lopd NAME --help` shows them."""
    page = _section(name)
    assert f"<!-- flags:{name} -->\n{flag_table(COMMANDS[name])}\n<!-- /flags -->" in page, (
        f"docs/stages/{name}.md: flag table out of date; run python -m lopd_cli.flag_tables")
    rows = page.split(f"<!-- flags:{name} -->")[1].split("<!-- /flags -->")[0]
    flags = {o for p in COMMANDS[name].params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
    assert {f for f in flags if f"`{f}`" not in rows and f"`{f}/" not in rows and f"/{f}`" not in rows} == set()


def test_no_page_s_flag_table_is_out_of_date():
    assert flag_tables.write(check=True) == []


def test_a_help_s_named_default_goes_to_the_default_column():
    table = flag_tables.flag_table(COMMANDS["evaluate"])
    row = next(line for line in table.splitlines() if line.startswith("| `--limit` |"))
    assert row.startswith("| `--limit` | all | At most N tasks;") and "(default" not in row
    assert flag_tables._default_in_help("Path (default: a (b) c); more.") == ("Path; more.", "a (b) c")
    assert "| `--resume/--no-resume` |" not in table and "| `--resume` | off |" in table
    with pytest.raises(ValueError, match="no command 'nope'"):
        flag_tables.with_tables("<!-- flags:nope -->\n<!-- /flags -->", {"ladder": ""})


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_boolean_flags_without_a_value(name):
    """`--resume <bool>` read as if it took a value; boolean flags show none."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--" in result.output
    assert "<bool>" not in result.output


def _stage_configs() -> dict:
    """Each stage command's name and its settings model."""
    from stages import collect, evaluate, index, sft
    from stages.coldstart import recipe as coldstart
    from stages.distill import recipe as distill

    return {"collect": collect.CollectConfig, "index": index.IndexConfig, "coldstart": coldstart.ColdstartConfig,
            "distill": distill.DistillConfig, "evaluate": evaluate.EvaluateConfig, "sft": sft.SftConfig}


def test_every_config_field_of_every_stage_is_a_flag():
    """One set of options: each stage config field (and each lopd option of distill) is a flag
    spelled like the field (``max_new_tokens`` -> ``--max-new-tokens``; lopd's ``lam`` is ``--lambda``)."""
    from stages.methods import get_method

    for name, config in _stage_configs().items():
        flags = {o for p in COMMANDS[name].params for o in (*p.opts, *p.secondary_opts)}
        fields = [f for f in config.model_fields if f != "options"]
        if name == "distill":
            fields += list(get_method("lopd").Options.model_fields)
        missing = [f for f in fields if "--" + {"lam": "lambda"}.get(f, f).replace("_", "-") not in flags]
        assert missing == [], f"lopd {name}: settings without a flag"


def test_each_stage_flag_s_default_and_help_are_its_field_s():
    """Declared once: a stage flag is made from its settings field (its description the help, its
    default the flag's), so the CLI cannot restate either."""
    for name, config in _stage_configs().items():
        for field, info in config.model_fields.items():
            if field == "options":
                continue
            param = next(p for p in COMMANDS[name].params if p.name == field)
            assert info.description and param.help == info.description, (name, field)
            assert param.default == (None if info.is_required() else info.default), (name, field)


def _choices(annotation) -> list[str]:
    """The values of a ``Literal`` field, also inside ``Literal[...] | None``."""
    import types
    from typing import Literal, Union, get_args, get_origin

    if get_origin(annotation) is Literal:
        return [str(a) for a in get_args(annotation)]
    if get_origin(annotation) in (Union, types.UnionType):
        return [c for a in get_args(annotation) for c in _choices(a)]
    return []


def test_help_shows_the_choices_of_every_fixed_choice_setting():
    """`--readout <str>` did not say which values it takes: a setting with a fixed set of values
    (a ``Literal``) shows them as its metavar, ``[a|b|c]``, in the settings' order; --bench, whose
    ten names its help lists, is the one exception."""
    stages = _stage_configs()
    seen = 0
    for name, config in stages.items():
        for field, info in config.model_fields.items():
            choices = _choices(info.annotation)
            if not choices or field == "bench":
                continue
            param = next(p for p in COMMANDS[name].params if p.name == field)
            assert param.metavar == f"[{'|'.join(choices)}]", (name, field)
            seen += 1
    assert seen >= 20
    bench = next(p for p in COMMANDS["evaluate"].params if p.name == "bench")
    assert all(b in bench.help for b in _choices(stages["evaluate"].model_fields["bench"].annotation))
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, ["coldstart", "--help"], env={"COLUMNS": "200"}).output
    assert "--readout [qformer|pointer|span|centred]" in shown


def test_every_stage_reads_a_config_file_that_flags_override(tmp_path):
    """`--config FILE` on collect/index/coldstart/evaluate (distill has its own): the file's keys
    apply, a flag given beats the file, an older spelling is accepted with a note, an unknown key
    is one line naming the file. (A store that does not exist stops each run before any model.)"""
    from typer.testing import CliRunner

    runner = CliRunner()
    config = tmp_path / "index.toml"
    config.write_text(f'store = "{tmp_path / "from-file"}"\nbatch_size = 4\n')
    result = runner.invoke(app, ["index", "--config", str(config)])
    assert result.exit_code == 2 and f"no experience store at {tmp_path / 'from-file'}" in result.output
    result = runner.invoke(app, ["index", "--config", str(config), "--store", str(tmp_path / "from-flag")])
    assert result.exit_code == 2 and f"no experience store at {tmp_path / 'from-flag'}" in result.output
    old = tmp_path / "coldstart.yaml"
    old.write_text(f"experiences: {tmp_path / 'from-yaml'}\ngrad_checkpointing: false\n")
    result = runner.invoke(app, ["coldstart", "--config", str(old)])
    assert "'grad_checkpointing' is the older name of 'activation_checkpointing'" in result.output
    assert result.exit_code == 2 and f"no experience store at {tmp_path / 'from-yaml'}" in result.output
    bad = tmp_path / "bad.toml"
    bad.write_text('stroe = "x"\n')
    for command in ("collect", "index", "coldstart", "evaluate"):
        result = runner.invoke(app, [command, "--config", str(bad)])
        assert result.exit_code == 2 and f"bad.toml: unknown option 'stroe' for lopd {command}: " in result.output
        assert command == "coldstart" or "did you mean 'store'? options: " in result.output  # coldstart has no store
    bad.write_text('env = "bfcl"\nlimit = "three"\n')  # a bad value of the file: its key named, not a flag
    result = runner.invoke(app, ["collect", "--config", str(bad), "--store", str(tmp_path / "s")])
    assert result.exit_code == 2 and result.output.startswith(
        f"error: {bad}: key 'limit': Input should be a valid integer"), result.output
    result = runner.invoke(app, ["collect", "--config", str(bad), "--limit", "0"])  # given as a flag: the flag
    assert result.exit_code == 2 and "error: invalid option --limit: Input should be greater" in result.output
    from stages.envs import env_names

    result = runner.invoke(app, ["collect"])
    assert result.exit_code == 2 and f"--env is required ({', '.join(env_names())})" in result.output
    assert len(env_names()) >= 7


def test_the_methods_table_names_grpo_s_aggregations_as_the_option_takes_them():
    from typing import get_args

    from stages.methods import get_method

    row = next(line for line in _section("distill").splitlines() if line.startswith("| `grpo` |"))
    values = get_args(get_method("grpo").Options.model_fields["aggregation"].annotation)
    assert values and all(f"`{value}`" in row for value in values), values
