"""A refusal over something missing names the command that makes it: the store (lopd collect),
the composer (lopd coldstart), verified answers (lopd collect --reference, an env that has them),
more experiences (lopd collect)."""
from __future__ import annotations

import pytest
from rich.console import Console
from typer.testing import CliRunner

from lopd_cli.main import app
from stages.collect import CollectConfig, _with_reference
from stages.core.data.store import ExperienceStore, StoreError
from stages.core.run.resources import check_experience_count
from stages.envs import EnvError


def test_a_missing_store_names_lopd_collect(tmp_path):
    with pytest.raises(StoreError, match=rf"^no experience store at {tmp_path / 's'} \(`lopd collect --env ENV "
                                         rf"--store {tmp_path / 's'}` makes one\)$"):
        ExperienceStore.open(tmp_path / "s", create=False)
    with pytest.raises(ValueError, match=r"lower --J or collect more \(`lopd collect --split train --store runs/s`\)"):
        check_experience_count(3, 2, store="runs/s")


def test_a_missing_composer_names_lopd_coldstart():
    result = CliRunner().invoke(app, ["distill", "--env", "bfcl", "--store", "s"])
    assert result.exit_code == 2
    assert ("--composer is required by method 'lopd' (as a flag or in the --config file); `lopd coldstart "
            "--experiences STORE --out DIR` makes one (then --composer DIR/final)") in " ".join(result.output.split())


def test_reference_refusals_name_the_envs_that_have_them():
    config = CollectConfig(env="bfcl", store="s", reference=True)
    with pytest.raises(EnvError, match=r"drop --reference, or collect them from an env that has them \(bfcl, lopd-bed"):
        _with_reference(object(), [], config, Console(file=None))

    class NoneHave:
        def reference_actions(self, task):
            raise EnvError("no answer")

    with pytest.raises(EnvError, match=r"none of the 1 train task\(s\) has a reference solution \(no answer\); .*"
                                       r"--env lopd-bed: the study bed"):
        _with_reference(NoneHave(), [object()], config, Console(file=None))
