"""Where does the cold-start composer lose its input dependence? (docs/results/composer-ladder.md)

Trains a fresh composer of one `lopd coldstart` setting for a few steps, once per variant that
lets only some of phi's parameter groups move (the rest keep their seeded init), and after every
step measures the mean cosine between the latents of different experiences (the ladder's latent
diversity) on the experiences retrieved for the first held-out targets. A group whose update alone
takes the cosine to ~1 is where the collapse happens. One thread, CPU; the run folders go to a
temporary folder.

Usage (from the repository root, the bed's store and warm-started backbone as in the ladder):
  python examples/study/composer_collapse.py --store runs/bed2/store --model runs/bed2/sft0/final/student \\
      --steps 5 --out docs/results/composer-ladder/bed2/collapse.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from stages.coldstart.ladder.rungs import distinct_rows, mean_pairwise_cosine
from stages.coldstart.recipe import Coldstart
from stages.coldstart.settings import ColdstartConfig
from stages.core.latent.contexts import build_batch
from stages.core.models.composer import adapter_parameters

# the groups of phi a variant trains (the encoder LoRA psi, the compressor's queries, its blocks, its output LayerNorm)
VARIANTS = {
    "all": ("lora", "queries", "blocks", "out_norm"),
    "lora only": ("lora",),
    "compressor only": ("queries", "blocks", "out_norm"),
    "blocks only": ("blocks",),
    "queries only": ("queries",),
    "out_norm only": ("out_norm",),
}


def groups(cs: Coldstart) -> dict[str, list[torch.nn.Parameter]]:
    comp = cs.composer.compressor
    out = {"lora": adapter_parameters(cs.composer.backbone, cs.composer.adapter_name), "queries": [comp.queries],
           "blocks": list(comp.blocks.parameters()), "out_norm": list(comp.out_norm.parameters())}
    if comp.readout == "centred":  # its learned constant trains with the out_norm group
        out["out_norm"].append(comp.latent_bias)
    return out


@torch.no_grad()
def latent_cosine(cs: Coldstart, n_targets: int) -> float:
    """Mean pairwise cosine of the latents of the distinct experiences retrieved for the first held-out targets."""
    targets = cs.targets.heldout[:n_targets]
    exps = cs.data.experiences(targets, heldout=True)
    c = cs.config
    batch = build_batch(cs.tokenizer, targets, exps, J=c.J, max_exp_tokens=c.max_exp_tokens, max_len=c.max_len,
                        tools=cs.data.tools(targets))
    was = cs.composer.backbone.training
    cs.composer.backbone.eval()
    latents = cs.composer(batch.exp_ids_BJL, batch.exp_mask_BJL).reshape(-1, c.K, cs.composer.hparams["hidden_size"])
    cs.composer.backbone.train(was)
    return mean_pairwise_cosine(distinct_rows(latents, [batch]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--targets", type=int, default=12, help="held-out targets whose experiences are measured")
    ap.add_argument("--readout", default="qformer", choices=["qformer", "centred"], help="the compressor's readout")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                    help="which parameter groups to train, one run each (default: every variant)")
    ap.add_argument("--out", help="write the cosines as JSON here")
    args = ap.parse_args()
    results = {}
    for name in args.variants:
        trained = VARIANTS[name]
        with tempfile.TemporaryDirectory() as tmp:
            config = ColdstartConfig(experiences=args.store, model=args.model, out=str(Path(tmp) / "run"),
                                     steps=args.steps + 1000, lr=args.lr, J=2, K=8, depth=2, max_exp_tokens=192,
                                     batch_size=2, self_retrieval=True, memory_norm="token", readout=args.readout,
                                     activation_checkpointing=False, heldout_fraction=0.2, seed=0, ladder=False,
                                     eval_every=10_000, checkpoint_every=10_000)
            cs = Coldstart(config)
            params = [p for g in trained for p in groups(cs)[g]]
            cs.params = params
            cs.optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
            cosines, losses = [latent_cosine(cs, args.targets)], []  # config.steps lies beyond: no final held-out check
            for step in range(args.steps):
                losses.append(cs.loss_step(step)["loss"])
                cosines.append(latent_cosine(cs, args.targets))
            results[name] = {"trained": list(trained), "cosine_after_step": cosines, "loss": losses}
            print(f"{name:16s} cosine {' '.join(f'{c:.3f}' for c in cosines)}  loss {' '.join(f'{x:.3f}' for x in losses)}",
                  flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": vars(args), "variants": results}, indent=2))


if __name__ == "__main__":
    main()
