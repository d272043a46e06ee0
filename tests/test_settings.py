"""The one settings path (stages/settings.py): flags given > --config file > a resumed run's saved
settings > the command's defaults, for every stage; and distill's lopd flags made from LOPD's
Options model."""
from __future__ import annotations

import json

import pytest
import typer

from lopd_cli.main import app
from stages.coldstart.recipe import ColdstartConfig
from stages.collect import CollectConfig
from stages.settings import merge, resolve, saved_settings


def test_precedence_flags_file_saved_defaults(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"experiences": "saved", "out": str(out), "steps": 7,
                                                  "lr": 0.5, "depth": 3}))
    config = tmp_path / "c.toml"
    config.write_text(f'out = "{out}"\nsteps = 9\nlr = 0.25\n')
    defaults = {"experiences": "runs/store", "out": "runs/composer0", "steps": 200, "lr": 1e-4, "depth": 8,
                "batch_size": 2, "resume": False}
    values = resolve(ColdstartConfig, "coldstart", {"lr": 0.125, "resume": True}, str(config),
                     defaults=defaults, resume=True)
    assert (values["lr"], values["steps"], values["depth"], values["batch_size"]) == (0.125, 9, 3, 2)
    assert values["experiences"] == "saved" and values["resume"] is True
    fresh = resolve(ColdstartConfig, "coldstart", {}, str(config), defaults=defaults)  # no resume: no saved layer
    assert (fresh["depth"], fresh["experiences"]) == (8, "runs/store")


def test_older_names_are_renamed_with_a_note_and_unknown_keys_refused(tmp_path):
    notes = []
    config = tmp_path / "c.yaml"
    config.write_text("grad_checkpointing: false\n")
    values = resolve(ColdstartConfig, "coldstart", {}, str(config), defaults={"activation_checkpointing": True},
                     note=notes.append)
    assert values == {"activation_checkpointing": False}
    assert notes == [f"{config}: 'grad_checkpointing' is the older name of 'activation_checkpointing'"]
    config.write_text("stroe: x\n")
    with pytest.raises(ValueError, match="c.yaml: unknown option 'stroe' for lopd coldstart: did you mean 'store'\\? "
                                         "options: "):
        resolve(ColdstartConfig, "coldstart", {}, str(config), defaults={"store": "s"})
    config.write_text("coldstart:\n  steps: 3\n")  # a table: its settings belong at the top level
    with pytest.raises(ValueError, match=r"c.yaml: unknown table \[coldstart\]: lopd coldstart reads its settings "
                                         "from the top level"):
        resolve(ColdstartConfig, "coldstart", {}, str(config), defaults={"steps": 200})


def test_a_bad_value_of_the_file_is_named_as_its_key_and_a_flag_is_left_to_the_cli(tmp_path):
    from pydantic import ValidationError

    from stages.settings import validated

    config = tmp_path / "c.toml"
    config.write_text('max_steps = "three"\n')  # an older spelling: named as written
    values = resolve(CollectConfig, "collect", {"env": "bfcl"}, str(config), defaults={"store": "s", "max_turns": 30},
                     note=lambda _: None)
    with pytest.raises(ValueError, match=r"^.*c.toml: key 'max_steps': Input should be a valid integer, .*"
                                         r"\(got 'three'\)$"):
        validated(CollectConfig, values, flags={"env": "bfcl"}, config_file=str(config))
    with pytest.raises(ValidationError):  # the same bad value given as a flag: the CLI names the flag
        validated(CollectConfig, {"env": "bfcl", "store": "s", "max_turns": "three"}, flags={"max_turns": "three"},
                  config_file=str(config))


def test_saved_method_options_are_flat_settings(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"env": "bfcl", "options": {"margin": 0.1}}))
    assert saved_settings(tmp_path) == {"env": "bfcl", "margin": 0.1}
    assert saved_settings(tmp_path / "none") == {}
    assert merge({"a": 1, "b": 1}, {"b": 2}) == {"a": 1, "b": 2}


def test_lopd_options_are_distill_flags_with_their_help():
    from typer.testing import CliRunner

    distill = typer.main.get_command(app).commands["distill"]
    flags = {o for p in distill.params for o in (*p.opts, *p.secondary_opts)}
    assert {"--composer", "--margin", "--J", "--K", "--M", "--lambda", "--eta-beta", "--beta0", "--composer-lr",
            "--max-exp-tokens", "--exclude-same-task", "--allow-same-task", "--freeze-composer",
            "--train-composer"} <= flags
    shown = " ".join(CliRunner().invoke(app, ["distill", "--help"]).output.split())
    assert "Privileged margin m (0 = the no-margin ablation). [default: 0.05]" in shown


def test_a_lopd_flag_reaches_the_run_config(tmp_path, monkeypatch):
    """The flags made from the Options model land in DistillConfig.options, next to -o pairs."""
    from typer.testing import CliRunner

    from stages.distill import recipe as distill

    seen = {}
    monkeypatch.setattr(distill, "run", lambda config: seen.setdefault("config", config))
    (tmp_path / "composer_config.json").write_text('{"K": 4}')  # the CLI reads it before the run (a fast refusal)
    result = CliRunner().invoke(app, ["distill", "--env", "bfcl", "--composer", str(tmp_path), "--margin", "0.07",
                                      "--J", "2", "--K", "4", "--lambda", "0.3", "--exclude-same-task",
                                      "-o", "M=5", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    options = seen["config"].options
    assert (options.margin, options.J, options.K, options.lam, options.M) == (0.07, 2, 4, 0.3, 5)
    assert options.exclude_same_task is True and options.eta_beta == 0.5


def test_a_name_that_is_no_string_gets_the_one_line_refusal_without_a_hint():
    from stages.core.registry import did_you_mean
    from stages.methods import get_method

    assert did_you_mean(1, ["lopd", "grpo"]) == "" and did_you_mean("lpod", ["lopd", "grpo"]) == "did you mean 'lopd'? "
    with pytest.raises(ValueError, match="unknown method 1"):
        get_method(1)


@pytest.mark.parametrize(("args", "expected"), [
    (["sft", "--config", "CFG", "--store", "s"],
     "CFG: unknown option 'learning_rate' for lopd sft: did you mean 'lr'? options: "),
    (["distill", "--config", "CFG"], "CFG: unknown option 'learning_rate' for method 'lopd': did you mean 'lr'? "),
    (["sft", "--dtype", "bf16"], "invalid option --dtype: did you mean 'bfloat16'? Input should be 'float32', "),
    (["evaluate", "--bench", "bfcl_v3"], "invalid option --bench: did you mean 'bfcl-v3'? Input should be "),
])
def test_the_fields_usual_names_get_a_did_you_mean(tmp_path, args, expected):
    from typer.testing import CliRunner

    config = tmp_path / "c.toml"
    config.write_text("learning_rate = 1e-5\n")  # transformers' and TRL's name of lopd's lr
    result = CliRunner().invoke(app, [str(config) if a == "CFG" else a for a in args])
    assert result.exit_code == 2
    assert " ".join(result.output.split()).startswith("error: " + expected.replace("CFG", str(config)))
