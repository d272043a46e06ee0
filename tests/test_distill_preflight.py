"""`lopd distill` fails before any model loads and before anything is written (issue 31 items
2, 3, 5, 12): the logger package, a missing store (`--new-store` starts one), the data-parallel
split of `--nproc` (checked before torchrun starts), J and K read from the composer.

Tiny in-process model, toy environment and seed store of tests/test_distill.py.
"""
from __future__ import annotations

import json
import shutil
import sys

import pytest
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.core.data.store import ExperienceStore
import stages.core.run.distributed as distributed
from stages.core.run.tracking import check_logger
from stages.distill.settings import settings
import stages.methods.lopd as lopd_method
from tests.test_distill import ENV, _hash_embedder, assets  # noqa: F401 (fixtures)

runner = CliRunner()


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: every check under test runs before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the failing check")
    monkeypatch.setattr(lopd_method, "load_models", refuse)


def _args(assets, tmp_path, *extra: str, store: str | None = None) -> list[str]:
    model_dir, composer_dir, store_template = assets
    if store is None:
        store = str(tmp_path / "store")
        if not (tmp_path / "store").exists():
            shutil.copytree(store_template, store)
    return ["distill", "--env", ENV, "--store", store, "--composer", str(composer_dir),
            "--out", str(tmp_path / "run"), "--model", str(model_dir), "--steps", "1", "--max-new-tokens", "4",
            "--M", "5", "--run-id", "preflight", *extra]


def _one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_tensorboard_check_looks_for_the_tensorboard_package(monkeypatch):
    """torch ships torch.utils.tensorboard; its SummaryWriter needs the `tensorboard` package."""
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # absent, whatever is installed
    with pytest.raises(ValueError, match=r"--log tensorboard needs the `tensorboard` package"):
        check_logger("tensorboard")
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ValueError, match=r"--log wandb needs the `wandb` package"):
        check_logger("wandb")
    check_logger("none")


def test_a_logger_package_that_fails_to_import_is_one_line_too(monkeypatch, tmp_path):
    """An installed but broken package (its import raises) is caught by the same check."""
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "__init__.py").write_text("raise ImportError('libfoo.so: cannot open')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorboard", raising=False)
    with pytest.raises(ValueError, match=r"--log tensorboard needs the `tensorboard` package \(installed, but "
                                         r"importing tensorboard fails: libfoo.so: cannot open\)") as err:
        check_logger("tensorboard")
    assert "\n" not in str(err.value)


def test_log_tensorboard_without_the_package_fails_before_loading(assets, tmp_path, monkeypatch, no_model):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    line = _one_error_line(runner.invoke(app, _args(assets, tmp_path, "--log", "tensorboard")))
    assert "pip install -e '.[tensorboard]'" in line
    assert not (tmp_path / "run").exists()  # no config.json left to block the next run


@pytest.mark.parametrize("case", ["missing-store", "k-conflict", "env-data", "out-holds-a-run", "model-typo"])
def test_every_failing_check_runs_before_any_model_loads(assets, tmp_path, no_model, case):
    extra, store = [], None
    if case == "missing-store":
        store = str(tmp_path / "stroe")  # a typo
    elif case == "k-conflict":
        extra = ["--K", "8"]
    elif case == "env-data":
        extra = ["--env", "envscaler", "--data-dir", str(tmp_path / "no-data")]
    elif case == "model-typo":
        extra = ["--model", "smollm2-135"]
    else:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "config.json").write_text(json.dumps({"run_id": "other"}))
    line = _one_error_line(runner.invoke(app, _args(assets, tmp_path, *extra, store=store)))
    expected = {"missing-store": f"no experience store at {tmp_path / 'stroe'}", "k-conflict": "field 'K' is 4",
                "env-data": str(tmp_path / "no-data"), "out-holds-a-run": "already holds a distill run",
                "model-typo": "--model 'smollm2-135': not a local folder nor a cached model; did you mean 'smollm2-135m'?"}[case]
    assert expected in line
    assert not (tmp_path / "stroe").exists()
    assert case == "out-holds-a-run" or not (tmp_path / "run").exists()


def test_a_misspelt_model_is_named_before_the_method_s_own_options(tmp_path, no_model):
    """No --composer given (LOPD needs one): the misspelt --model is still the error shown."""
    line = _one_error_line(runner.invoke(app, ["distill", "--env", "lopd-bed", "--model", "smollm2-135",
                                               "--store", str(tmp_path / "s"), "--out", str(tmp_path / "o")]))
    assert "did you mean 'smollm2-135m'?" in line and "--composer" not in line
    assert not (tmp_path / "o").exists()


def test_missing_store_is_refused_and_new_store_starts_one(assets, tmp_path):
    fresh = tmp_path / "fresh-store"
    line = _one_error_line(runner.invoke(app, _args(assets, tmp_path, store=str(fresh))))
    assert f"no experience store at {fresh}" in line and "--new-store" in line
    assert not fresh.exists() and not (tmp_path / "run").exists()
    result = runner.invoke(app, _args(assets, tmp_path, "--new-store", "--resume", store=str(fresh)))
    assert result.exit_code == 0, result.output
    assert f"note: nothing to resume in {tmp_path / 'run'}: starting a new run" in " ".join(result.output.split())
    assert ExperienceStore.open(fresh, create=False).count(run_id="preflight") == 2 * 2  # B x G rollouts
    assert json.loads((tmp_path / "run" / "config.json").read_text())["new_store"] is True


def test_nproc_checks_everything_before_starting_torchrun(assets, tmp_path, monkeypatch, no_model):
    launched = []
    monkeypatch.setattr(distributed, "launch", lambda n, argv: launched.append((n, argv)) or 0)
    line = _one_error_line(runner.invoke(app, _args(assets, tmp_path, "--nproc", "2", "--tasks-per-step", "1")))
    assert "--tasks-per-step 1 < 2 processes" in line and launched == []
    line = _one_error_line(runner.invoke(app, _args(assets, tmp_path, "--nproc", "2", store=str(tmp_path / "nope"))))
    assert "no experience store" in line and launched == []
    result = runner.invoke(app, _args(assets, tmp_path, "--nproc", "2"))
    assert result.exit_code == 0, result.output
    (n, argv), = launched
    assert n == 2 and "--nproc" not in argv and argv[:3] == ["distill", "--env", ENV]
    assert not (tmp_path / "run").exists()  # the parent process writes nothing


def test_j_and_k_come_from_the_composer_unless_given(assets, tmp_path):
    _, composer_dir, _ = assets  # trained with J=2, K=4
    base = {"env": ENV, "composer": str(composer_dir), "out": str(tmp_path / "o")}
    config = settings(base)
    assert (config.options.J, config.options.K) == (2, 4)
    config = settings({**base, "J": 5})
    assert (config.options.J, config.options.K) == (5, 4)  # J may differ from the composer's
    toml = tmp_path / "run.toml"
    toml.write_text("K = 8\n")
    with pytest.raises(ValueError, match=r"composer_config.json: field 'K' is 4, but the run asks for K=8"):
        settings(base, str(toml))  # given in a file: kept, and refused against the composer


def test_settings_hand_on_the_method_options_typed_and_resolved(assets, tmp_path):
    """The run's settings hold the method's Options model, resolved against the composer when they
    are built (max_exp_tokens from it: 64), and save as the mapping a resume reads back."""
    from stages.distill.settings import DistillConfig
    from stages.methods.options import LOPDOptions

    _, composer_dir, _ = assets
    config = settings({"env": ENV, "composer": str(composer_dir), "out": str(tmp_path / "o")})
    assert isinstance(config.options, LOPDOptions) and config.options.max_exp_tokens == 64
    saved = json.loads(config.model_dump_json())
    assert saved["options"] == config.options.model_dump() and saved["options"]["max_exp_tokens"] == 64
    assert DistillConfig.model_validate(saved) == config


def test_an_option_flag_in_its_older_spelling_wins_over_the_file(tmp_path):
    """``-o lambda=...`` (the paper's name of LOPD's anchor weight) against a file's ``lambda`` or
    ``lam``: the flag's value, whichever spelling each used; both spellings as flags: refused."""
    base = {"env": ENV, "composer": str(tmp_path), "out": str(tmp_path / "o")}
    (tmp_path / "composer_config.json").write_text('{"K": 32}')
    for written in ("lambda", "lam"):
        toml = tmp_path / f"{written}.toml"
        toml.write_text(f"{written} = 0.1\n")
        assert settings({**base, "lambda": 0.2}, str(toml)).options.lam == 0.2
        assert settings({**base, "lam": 0.3}, str(toml)).options.lam == 0.3
        assert settings(base, str(toml)).options.lam == 0.1
    with pytest.raises(ValueError, match="^lam is given twice, as 'lambda' and as 'lam': give it once$"):
        settings({**base, "lambda": 0.2, "lam": 0.3})


@pytest.mark.parametrize("given, hint", [
    ("ppo_epoch=2", "did you mean 'ppo_epochs'? "),
    ("margin=0.1", "'margin' is an option of --method lopd; "),
    ("zzz=1", ""),
    # another method's exact option, also close to one of grpo's: both said, the exact one first
    ("reduction=x", "'reduction' is an option of --method opsd, sdft, sdpo; did you mean 'aggregation'? "),
])
def test_unknown_method_option_is_one_line_with_a_suggestion_and_the_defaults(given, hint, tmp_path):
    result = runner.invoke(app, ["distill", "--env", ENV, "--method", "grpo", "-o", given, "--out", str(tmp_path / "o")])
    line = _one_error_line(result)
    key = given.split("=")[0]
    assert line.startswith(f"error: unknown option {key!r} for method 'grpo': {hint}options of grpo: ")
    assert "eps_lo=0.2" in line and "ppo_epochs=1" in line and "aggregation='token-mean'" in line
    assert "Value error" not in line


def test_a_bad_option_value_names_the_option(tmp_path):
    line = _one_error_line(runner.invoke(app, ["distill", "--env", ENV, "--method", "grpo", "-o", "ppo_epochs=x"]))
    assert line.startswith("error: invalid option ppo_epochs: Input should be a valid integer")


@pytest.mark.parametrize("text, flags, expected", [
    ('steps = "three"', [], "{cfg}: key 'steps': Input should be a valid integer, unable to parse string as an "
                            "integer (got 'three')"),
    ('steps = "three"', ["--steps", "0"], "invalid option --steps: Input should be greater than or equal to 1 (got 0)"),
    ('lambda = "x"', [], "{cfg}: key 'lambda': Input should be a valid number"),
    ("lamda = 0.2", [], "{cfg}: unknown option 'lamda' for method 'lopd': did you mean 'lambda'? options of lopd: "),
    ("stpes = 3", [], "{cfg}: unknown option 'stpes' for method 'lopd': did you mean 'steps'? "),
    ("[distill]\nsteps = 3", [], "{cfg}: unknown table [distill]: lopd distill reads its settings from the top level"),
    ('method = "lpod"', [], "{cfg}: key 'method': unknown method 'lpod' (did you mean 'lopd'? known: grpo, lopd, "),
    ("[options]\nmargn = 0.1", [], "{cfg}: unknown option 'margn' for method 'lopd': did you mean 'margin'? "),
])
def test_a_config_file_error_names_the_file_and_its_key(tmp_path, no_model, text, flags, expected):
    """A bad key or value of --config is named as the file's key (a flag given instead: as the flag);
    an unknown key or table is reported before a missing --env."""
    cfg = tmp_path / "run.toml"
    env = "" if "[distill]" in text or "stpes" in text else f'env = "{ENV}"\ncomposer = "{tmp_path}"\n'
    cfg.write_text(env + text + "\n")
    line = _one_error_line(runner.invoke(app, ["distill", "--config", str(cfg), "--out", str(tmp_path / "o"), *flags]))
    assert line.startswith("error: " + expected.format(cfg=cfg))
    assert "lam=" not in line and not (tmp_path / "o").exists()
    if "lamda" in text:
        assert "lambda=0.2" in line


def test_a_bad_method_flag_is_named_as_its_flag(tmp_path, no_model):
    line = _one_error_line(runner.invoke(app, ["distill", "--env", ENV, "--composer", str(tmp_path), "--lambda", "-1"]))
    assert line == "error: invalid option --lambda: Input should be greater than or equal to 0 (got -1.0)"


def test_version_and_the_bfcl_limit_help():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"lopd {version('lopd')}"
    text = " ".join(runner.invoke(app, ["evaluate", "--help"]).output.split())  # help lines wrap
    assert "bfcl-v3: N per category, of its 4 (base, miss_func, miss_param, long_context), so --limit 1 runs 4 tasks" in text


def test_python_warnings_print_as_one_line(tmp_path, capsys):
    import warnings

    runner.invoke(app, ["store", "versions", "--store", str(tmp_path / "none")])  # any command sets it up
    from lopd_cli.errors import one_line_warning

    assert warnings.showwarning is one_line_warning
    warnings.showwarning(UserWarning("rows re-tokenized [from text]"), UserWarning, "/x/rows.py", 125)
    assert capsys.readouterr().err == "warning: rows re-tokenized [from text]\n"
