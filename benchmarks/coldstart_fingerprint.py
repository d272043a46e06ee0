"""Fingerprints of short seeded cold starts on the tiny test model, one per lever combination the
tests use: every metrics row (timings and memory left out), the held-out result, the ladder and the
sha256 of every file of ``final/`` and of the free-vector control. Two checkouts that train alike
print the same JSON; a refactor is checked with

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/coldstart_fingerprint.py > after.json

and a diff against the same command's output on the commit before it.
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402

from stages.coldstart import recipe as coldstart  # noqa: E402
from stages.coldstart.settings import ColdstartConfig  # noqa: E402
from stages.core.data.retrieval import index_new  # noqa: E402
from stages.core.data.store import ExperienceStore  # noqa: E402
from tests.test_coldstart import make_traj  # noqa: E402
from tests.test_coldstart_ladder import two_env_trajs  # noqa: E402
from tests.test_index import HashEmbedder  # noqa: E402
from tests.tiny import save_tiny  # noqa: E402

PAIRS = [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4), (6, 1), (8, 3)]
TIMING = ("seconds", "rss_mb", "peak_rss_mb")
COMBOS: dict[str, dict] = {
    "default": {},
    "per-turn": {"placement": "per-turn", "batch_size": 3},
    "framed-token-textkl-self": {"placement": "framed", "memory_norm": "token", "text_kl_weight": 1.0,
                                 "self_retrieval": True},
    "pointer": {"readout": "pointer"},
    "span": {"readout": "span"},
    "centred-token": {"readout": "centred", "memory_norm": "token"},
    "contrast": {"contrast_weight": 1.0},
    "reconstruction-lr-encoder": {"reconstruction_steps": 2, "lr_encoder": 3e-3, "latent_scale": 0.5},
    "no-shared-clip-off": {"qformer_shared": False, "depth": 2, "grad_clip": None},
    "ladder-textkl": {"two_env": True, "ladder": True, "ladder_targets": 0, "text_kl_weight": 1.0, "J": 1,
                      "heldout_fraction": 0.5, "batch_size": 4},
    "ladder-nll-checkpointing": {"two_env": True, "ladder": True, "ladder_targets": 0, "J": 1,
                                 "heldout_fraction": 0.5, "activation_checkpointing": True},
}


def _digest(path: Path) -> dict[str, str]:
    """sha256 of each weights file under ``path`` (or of ``path``); the JSON files name temporary paths."""
    files = sorted(path.rglob("*.safetensors")) if path.is_dir() else [path]
    return {str(p.relative_to(path) if path.is_dir() else p.name): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in files}


def main() -> None:
    torch.set_num_threads(1)
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny = str(save_tiny(root / "tiny"))
        stores = {}
        for name, rows in (("one", [make_traj(f"t{i}-{g}", a, b) for i, (a, b) in enumerate(PAIRS) for g in range(2)]),
                           ("two", two_env_trajs())):
            store = ExperienceStore.open(root / name)
            store.append(rows)
            index_new(store, HashEmbedder())
            stores[name] = str(root / name)
        for combo, kw in COMBOS.items():
            kw = dict(kw)
            store = stores["two" if kw.pop("two_env", False) else "one"]
            base = dict(experiences=store, out=str(root / combo), model=tiny, steps=4, lr=3e-3, batch_size=2, J=2,
                        K=4, depth=1, lora_rank=4, max_exp_tokens=96, max_len=1024, heldout_fraction=0.25,
                        checkpoint_every=2, eval_every=3, seed=0, ladder=False, activation_checkpointing=False)
            base.update(kw)
            coldstart.run(ColdstartConfig(**base), console=Console(file=open("/dev/null", "w")),
                          embedder=HashEmbedder())
            run = root / combo
            rows = [{k: v for k, v in json.loads(line).items() if k not in TIMING}
                    for line in (run / "metrics.jsonl").read_text().splitlines()]
            hparams = {k: v for k, v in json.loads((run / "final" / "composer_config.json").read_text()).items()
                       if k not in ("store", "backbone_id")}
            out[combo] = {"metrics": rows, "final": _digest(run / "final"), "hparams": hparams,
                          **{f.name: json.loads(f.read_text()) for f in (run / "heldout.json", run / "ladder.json")
                             if f.is_file()},
                          **({"free_prompt": _digest(run / "free_prompt.safetensors")}
                             if (run / "free_prompt.safetensors").is_file() else {})}
            print(combo, "done", file=sys.stderr)
    print(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
