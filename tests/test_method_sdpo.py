"""`lopd distill --method sdpo`: teacher contexts (sibling, feedback, none), the EMA teacher
(closed form after two steps, LoRA and full fine-tuning), gradients, micro-batches, and 2 steps
through the CLI on the tiny in-process model, killed between steps and resumed bit-exact."""
from __future__ import annotations

import json
import math
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from lopd_cli.main import app
from schemas import Message, Trajectory, Turn
from stages.core.data.rows import training_rows
from stages.core.models.composer import adapter_parameters
from stages.distill.recipe import TIMING_FIELDS, Distiller
from stages.methods import StepBatch, StepContext, get_method
from stages.methods.sdpo import CLOSING, FEEDBACK_HEAD, SOLUTION_HEAD, SDPO, SDPOOptions, feedback_text
from tests.test_distill import ENV, _hash_embedder, assets, metrics  # noqa: F401 (fixtures)

runner = CliRunner()


def _traj(tid: str, task: str, reward: float, actions: list[str], observations: list[str], info: dict | None = None):
    messages = [Message(role="system", content="You are a helpful assistant."),
                Message(role="user", content=f"Solve task {task}.")]
    turns = []
    for action, obs in zip(actions, observations):
        messages.append(Message(role="assistant", content=action))
        if obs:
            messages.append(Message(role="user", content=obs))
        turns.append(Turn(action=action, observation=obs, action_tokens=3))
    return Trajectory(trajectory_id=tid, task_id=task, env=ENV, split="train", prompt=f"Solve task {task}.",
                      policy="p", messages=messages, turns=turns, reward=reward, success=reward >= 1.0,
                      num_steps=len(turns), num_tool_calls=0, run_id="r", info=json.dumps(info or {}))


def _group_batch():
    return [
        _traj("a1", "A", 1.0, ["The answer is 4."], [""]),
        _traj("a2", "A", 0.0, ["It is 5.", "Yes."], ["Are you sure?", ""]),
        _traj("a0", "A", 1.0, ["<think>hmm</think>Four: 4."], [""]),
        _traj("b1", "B", 0.0, ["get the weather", "done"], ["sunny, 21", ""]),
        _traj("b2", "B", 0.3, ["no idea"], [""], info={"error_type": "value_error", "error": ["wrong city"]}),
        _traj("c1", "C", 1.0, ["ok"], [""]),  # a lone success: nothing to show its teacher
    ]


def _method(model_dir, rank: int = 4, **options):
    config = SimpleNamespace(model=str(model_dir), student_lora_rank=rank, temperature=0.7,
                             device=None, dtype=None, options=SDPOOptions(**options))
    return SDPO(config, None, {})


def _prepare(method, trajs):
    rows, _ = training_rows(method.student.tokenizer, trajs)
    batch = StepBatch(rows, trajs)
    batch.extras = method.prepare(batch, StepContext(None, None, None, 1))
    return batch


@pytest.mark.filterwarnings("ignore:some trajectories hold no token ids")
def test_contexts_sibling_then_feedback_else_masked(assets):
    assert SDPO.Options().feedback == "env"  # the default: the checker's error text counts as feedback
    method = _method(assets[0], feedback="observation")
    tok = method.student.tokenizer
    batch = _prepare(method, _group_batch())
    by_id = {r.trajectory.trajectory_id: e for r, e in zip(batch.rows, batch.extras)}
    # the first qualifying sibling by trajectory id, never the row itself; <think> removed
    assert (by_id["a1"].source, by_id["a1"].sibling_id) == ("sibling", "a0")
    assert (by_id["a2"].source, by_id["a2"].sibling_id) == ("sibling", "a0")
    assert (by_id["a0"].source, by_id["a0"].sibling_id) == ("sibling", "a1")
    assert by_id["a2"].text == f"{SOLUTION_HEAD}\nFour: 4.\n\n{CLOSING}"
    # no sibling: a failed attempt gets its last non-empty observation as feedback
    assert by_id["b1"].source == "feedback" and by_id["b1"].text == f"{FEEDBACK_HEAD}\nsunny, 21\n\n{CLOSING}"
    assert by_id["b2"].source is None and by_id["b2"].prefix_ids is None  # no observation at all
    assert by_id["c1"].source is None  # a lone success
    assert method.step_stats["no_context_frac"] == pytest.approx(2 / 6)
    assert method.step_stats["sibling_frac"] == pytest.approx(3 / 6)
    assert method.step_stats["feedback_frac"] == pytest.approx(1 / 6)
    kept = [r for r, e in zip(batch.rows, batch.extras) if e.source]
    assert all(e.tokens == sum(int(r.mask_T.sum()) for r in kept) and e.rows == 4 for e in batch.extras)
    # the teacher's prompt is the student's prompt with the context in the first user message
    row = next(r for r in batch.rows if r.trajectory.trajectory_id == "a2")
    text = tok.decode(by_id["a2"].prefix_ids)
    user = text.split("<|im_start|>user\n")[1]
    assert user.startswith("Solve task A.\n\n" + SOLUTION_HEAD) and CLOSING in user
    assert "hmm" not in text and "Four: 4." in text
    # "env" feedback (the default): the environment's recorded error when no observation carries one
    env = _method(assets[0])
    env_batch = _prepare(env, _group_batch())
    b2 = next(e for r, e in zip(env_batch.rows, env_batch.extras) if r.trajectory.trajectory_id == "b2")
    assert b2.source == "feedback" and 'error_type: value_error\nerror: ["wrong city"]' in b2.text
    # "none" = siblings only (B.1); a threshold of 0.3 makes b2 a sibling of b1
    none = _method(assets[0], feedback="none", success_threshold=0.3)
    none_batch = _prepare(none, _group_batch())
    got = {r.trajectory.trajectory_id: (e.source, e.sibling_id) for r, e in zip(none_batch.rows, none_batch.extras)}
    assert got["b1"] == ("sibling", "b2") and got["b2"] == (None, "")
    assert row.first_turn == 0


def _perturb(params, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(0.1 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("rank", [4, 0])
def test_ema_teacher_equals_the_closed_form_after_two_steps(assets, rank):
    method = _method(assets[0], rank=rank, ema_rate=0.25)
    s = method.student
    if rank:
        teacher = lambda: [p.detach().clone() for p in adapter_parameters(s.model, "teacher")]  # noqa: E731
        assert all(not p.requires_grad for p in adapter_parameters(s.model, "teacher"))
    else:
        teacher = lambda: [p.detach().clone() for p in method.teacher_model.parameters()]  # noqa: E731
        assert all(not p.requires_grad for p in method.teacher_model.parameters())
        assert method.teacher_model is not s.model
    t0 = teacher()
    assert all(torch.equal(a, b.detach()) for a, b in zip(t0, s.params))  # starts as the student
    r = 0.25
    _perturb(s.params, 1)  # an optimizer step
    s1 = [p.detach().clone() for p in s.params]
    method.after_step({})
    _perturb(s.params, 2)
    s2 = [p.detach().clone() for p in s.params]
    method.after_step({})
    for got, a, b, c in zip(teacher(), t0, s1, s2):
        torch.testing.assert_close(got, (1 - r) ** 2 * a + r * (1 - r) * b + r * c, atol=1e-6, rtol=1e-6)
    assert all(torch.equal(p.detach(), b) for p, b in zip(s.params, s2))  # the student is untouched


@pytest.mark.parametrize("rank", [4, 0])
def test_the_teacher_is_saved_and_restored_exactly(assets, tmp_path, rank):
    from stages.core.models.assembly import save_student

    method = _method(assets[0], rank=rank)
    s = method.student
    _perturb(s.params, 4)
    method.after_step({})
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_student(folder, student=s.model, adapter=s.adapter, tokenizer=s.tokenizer,
                 optimizer=torch.optim.AdamW(s.params))
    method.save(folder)
    assert (folder / "teacher").is_dir()
    config = SimpleNamespace(model=str(assets[0]), student_lora_rank=rank, temperature=0.7,
                             device=None, dtype=None, options=SDPOOptions())
    again = SDPO(config, folder, {})
    if rank:
        want, got = adapter_parameters(s.model, "teacher"), adapter_parameters(again.student.model, "teacher")
        assert all(not p.requires_grad for p in got) and all(p.requires_grad for p in again.student.params)
    else:
        want, got = list(method.teacher_model.parameters()), list(again.teacher_model.parameters())
        assert all(not p.requires_grad for p in got)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert not all(torch.equal(a, b) for a, b in zip(got, s.params))  # the EMA lags the student


@pytest.mark.filterwarnings("ignore:some trajectories hold no token ids")
def test_gradient_reaches_the_student_only_and_micro_batches_add_up(assets):
    method = _method(assets[0], k=5)
    s = method.student
    _perturb(s.params, 3)  # LoRA B starts at zero: make student and teacher differ
    batch = _prepare(method, _group_batch())
    loss, m = method.loss(batch.rows, batch.extras, 1.0)
    loss.backward()
    assert all(p.grad is None for p in adapter_parameters(s.model, "teacher"))
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in s.params)
    whole = [p.grad.clone() for p in s.params]
    assert math.isfinite(m["reverse_kl"]) and m["reverse_kl"] > 0 and m["is_ratio"] > 0
    for p in s.params:
        p.grad = None
    total, sums = 0.0, {}
    for i in range(len(batch.rows)):  # micro-batches of one row (two of them masked)
        part, pm = method.loss(batch.rows[i:i + 1], batch.extras[i:i + 1], 1 / len(batch.rows))
        part.backward()
        total += float(part.detach())
        for key, value in pm.items():
            sums[key] = sums.get(key, 0.0) + value
    assert total == pytest.approx(float(loss.detach()), rel=1e-5)
    for key in ("reverse_kl", "is_ratio", "student_tail_mass", "teacher_tail_mass"):
        assert sums[key] == pytest.approx(m[key], rel=1e-5), key
    for a, p in zip(whole, s.params):
        torch.testing.assert_close(p.grad, a, atol=1e-6, rtol=1e-4)
    masked = [i for i, e in enumerate(batch.extras) if e.source is None]
    zero, zm = method.loss([batch.rows[i] for i in masked], [batch.extras[i] for i in masked], 1.0)
    assert float(zero.detach()) == 0.0 and zm["reverse_kl"] == 0.0 and zero.requires_grad


@pytest.mark.filterwarnings("ignore:some trajectories hold no token ids")
def test_loss_temperature_defaults_to_the_sampling_temperature(assets):
    """Default: the divergence on logits / --temperature (0.7 here), as upstream SDPO; an explicit
    ``loss_temperature`` equal to it gives the same loss, ``loss_temperature=1`` the raw logits'."""
    losses = {}
    for name, options in (("default", {}), ("0.7", {"loss_temperature": 0.7}), ("1", {"loss_temperature": 1.0})):
        torch.manual_seed(0)  # the same LoRA initialisation each time
        method = _method(assets[0], k=5, **options)
        _perturb(method.student.params, 3)
        batch = _prepare(method, _group_batch())
        with torch.no_grad():
            losses[name] = float(method.loss(batch.rows, batch.extras, 1.0)[0])
    assert losses["default"] == losses["0.7"]
    assert abs(losses["default"] - losses["1"]) > 1e-4 * abs(losses["1"])
    with pytest.raises(ValueError, match="loss_temperature"):
        SDPOOptions(loss_temperature=0.0)


def _cli(args: list[str]):
    return runner.invoke(app, args)


def test_two_steps_through_the_cli_killed_and_resumed_bit_exact(assets, tmp_path, monkeypatch):
    model_dir, _, store_template = assets
    assert get_method("sdpo") is SDPO and not get_method("sdpo").needs_composer

    def args(name: str) -> list[str]:
        store = tmp_path / f"store-{name}"
        if not store.exists():
            shutil.copytree(store_template, store)
        return ["distill", "--method", "sdpo", "--env", ENV, "--store", str(store), "--out", str(tmp_path / name),
                "--model", str(model_dir), "--steps", "2", "--tasks-per-step", "1", "--group-size", "2",
                "--max-new-tokens", "6", "--lr", "1e-2", "--student-lora-rank", "4", "--checkpoint-every", "1",
                "--seed", "1", "-o", "k=5", "-o", "run_id=sdpo-test"]

    res = _cli(args("straight"))
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"
    real_save = Distiller.save_checkpoint

    def die_at_step_2(self):
        if self.step == 2:  # step 2's rows and metrics are written, its checkpoint is not
            raise KeyboardInterrupt("simulated SIGKILL")
        return real_save(self)

    monkeypatch.setattr(Distiller, "save_checkpoint", die_at_step_2)
    res = _cli(args("killed"))
    assert res.exit_code == 130  # click turns the interrupt into exit code 130
    monkeypatch.setattr(Distiller, "save_checkpoint", real_save)
    killed = tmp_path / "killed"
    assert len(metrics(killed)) == 2 and (killed / "checkpoints" / "step-1" / "teacher").is_dir()
    res = _cli(["distill", "--out", str(killed), "--resume"])
    assert res.exit_code == 0, f"{res.output}\n{res.exception!r}"

    straight = tmp_path / "straight"
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]  # noqa: E731
    rows = metrics(straight)
    assert strip(metrics(killed)) == strip(rows)
    assert [r["step"] for r in rows] == [1, 2] and "beta" not in rows[0]
    for r in rows:
        assert all(math.isfinite(r[k]) for k in SDPO.metrics)
        assert r["no_context_frac"] + r["sibling_frac"] + r["feedback_frac"] == pytest.approx(1.0)
    assert any(r["distill_tokens"] > 0 and r["reverse_kl"] > 0 for r in rows)
    for sub in ("final/student/model.safetensors", "checkpoints/step-2/teacher/adapter_model.safetensors",
                "checkpoints/step-2/student/adapter_model.safetensors"):
        a, b = load_file(str(killed / sub)), load_file(str(straight / sub))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sub
    t1 = load_file(str(straight / "checkpoints/step-1/teacher/adapter_model.safetensors"))
    t2 = load_file(str(straight / "checkpoints/step-2/teacher/adapter_model.safetensors"))
    assert any(not torch.equal(t1[k], t2[k]) for k in t1)  # the EMA teacher moves
    assert not (straight / "final" / "composer").exists() and not (straight / "final" / "teacher").exists()


def test_env_feedback_reads_the_coding_judges_first_failure():
    """taco's and livecodebench's checkers record ``{passed, total, first_failure}``: a failed
    attempt there gets that as feedback (it had none, so SDPO never trained on coding tasks)."""
    verdict = {"passed": 1, "total": 3, "first_failure": "runtime error: NameError: name 'num' is not defined",
               "success": False}
    traj = _traj("t1", "T", 0.0, ["```python\nprint(num)\n```"], [""], info=verdict)
    assert feedback_text(traj, "env", 4000) == "first_failure: runtime error: NameError: name 'num' is not defined"
    assert feedback_text(traj, "none", 4000) == ""
