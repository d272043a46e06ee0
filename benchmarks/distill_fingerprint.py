"""Fingerprints of short seeded `lopd distill` runs on the tiny test model, one per method: every
metrics row (timings and memory left out) and the sha256 of every weights file of ``final/``. The
runs go through the command line (``python -m tests.distill_driver``, the tests' toy environment and
hashing embedder), so two checkouts whose flags agree are compared as a user runs them:

    OMP_NUM_THREADS=1 python benchmarks/distill_fingerprint.py --tree . > after.json
    OMP_NUM_THREADS=1 python benchmarks/distill_fingerprint.py --tree /tmp/before > before.json

(``--tree``: the checkout whose code runs; the tiny model, store and composer are made once by this
checkout in a temporary folder and given to both.)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("seconds", "rss_mb", "peak_rss_mb", "peak_gpu_mb", "tokens_per_s")
METHODS: dict[str, list[str]] = {
    "lopd": ["--method", "lopd", "--J", "2", "--K", "4", "--M", "5"],
    "lopd-full-ft": ["--method", "lopd", "--J", "2", "--K", "4", "--M", "5", "--student-lora-rank", "0"],
    "grpo": ["--method", "grpo", "-o", "kl_coef=0.1"],
    "opsd": ["--method", "opsd"],
    "sdft": ["--method", "sdft"],
    "sdpo": ["--method", "sdpo"],
}


def assets(folder: Path) -> tuple[Path, Path, Path]:
    """The tiny model, a cold-start composer on it and an indexed store of seed trajectories."""
    sys.path.insert(0, str(ROOT))
    import torch

    from stages.core.data.retrieval import index_new
    from stages.core.data.store import ExperienceStore
    from stages.core.models.backbone import load_policy
    from stages.core.models.composer import Composer, save_composer
    from tests.test_distill import SEED_ROWS, HashEmbedder, _seed_trajectory
    from tests.tiny import save_tiny

    model_dir = save_tiny(folder / "tiny")
    torch.manual_seed(0)
    composer = Composer(load_policy(str(model_dir))[0], J=2, K=4, depth=1, lora_rank=4, lora_alpha=8, max_exp_tokens=64)
    save_composer(composer, folder / "composer0", {"backbone_id": str(model_dir)})
    store = ExperienceStore.open(folder / "store")
    store.append([_seed_trajectory(i) for i in range(SEED_ROWS)])
    index_new(store, HashEmbedder())
    return model_dir, folder / "composer0", folder / "store"


def fingerprint(tree: Path, work: Path, model: Path, composer: Path, store: Path) -> dict:
    out: dict[str, dict] = {}
    for name, flags in METHODS.items():
        run_store = work / f"store-{name}"
        subprocess.run(["cp", "-r", str(store), str(run_store)], check=True)
        run_out = work / name
        argv = [sys.executable, "-m", "tests.distill_driver", "distill", "--env", "toy-distill", "--store",
                str(run_store), "--out", str(run_out), "--model", str(model), "--steps", "2", "--tasks-per-step", "2",
                "--group-size", "2", "--max-new-tokens", "8", "--temperature", "1.0", "--lr", "1e-2",
                "--micro-batch", "2", "--max-len", "256", "--checkpoint-every", "2", "--seed", "0", *flags]
        if name.startswith("lopd"):
            argv += ["--composer", str(composer)]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode:
            out[name] = {"error": done.stderr.strip().splitlines()[-1:] or done.stdout.strip().splitlines()[-1:]}
            continue
        rows = [json.loads(line) for line in (run_out / "metrics.jsonl").read_text().splitlines()]
        weights = sorted((run_out / "final").rglob("*.safetensors"))
        out[name] = {"rows": [{k: v for k, v in r.items() if k not in TIMING and not k.endswith("_s")} for r in rows],
                     "weights": {str(p.relative_to(run_out)): hashlib.sha256(p.read_bytes()).hexdigest()
                                 for p in weights}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose code runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model, composer, store = assets(work / "assets")
        print(json.dumps(fingerprint(args.tree.resolve(), work, model, composer, store), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
