"""The composer ladders of docs/results/composer-ladder/ side by side, as markdown (one row per lever).

    python examples/study/composer_ladder_table.py docs/results/composer-ladder/*.json

Per lever: the pooled NLL of every rung on all action tokens and on the decisive ones (where the
teacher without latents costs more than 1 nat), the paired differences (c) - (e), (c) - (h) and
(f) - (a) with their standard errors over targets, and the latent cosine.
"""
from __future__ import annotations

import sys
from pathlib import Path

from stages.coldstart.ladder.rungs import RUNGS, Ladder


def main() -> None:
    files = [Path(p) for p in sys.argv[1:] if not p.endswith(".config.json")]
    if not files:
        raise SystemExit("usage: composer_ladder_table.py LADDER.json [...]")
    ladders = {f.stem: Ladder.model_validate_json(f.read_text()) for f in files}
    for scope, key in (("all action tokens", "nll"), ("decisive tokens", "nll_decisive")):
        print(f"\nNLL (nats/token), {scope}:\n")
        print("| lever | n | tokens | " + " | ".join(f"({k})" for k in RUNGS) + " |")
        print("|---|---|---|" + "---|" * len(RUNGS))
        for name, lad in ladders.items():
            tokens = lad.tokens if key == "nll" else lad.decisive_tokens
            values = getattr(lad, key)
            print(f"| {name} | {lad.targets} | {tokens} | "
                  + " | ".join(f"{values[k]:.3f}" if k in values else "-" for k in RUNGS) + " |")
    print("\nPaired differences over targets (decisive tokens; all tokens in brackets), latent cosine:\n")
    pairs = [("c", "e"), ("c", "h"), ("c", "d"), ("f", "a"), ("c", "a")]
    print("| lever | " + " | ".join(f"({x}) - ({y})" for x, y in pairs) + " | (f) / (a) | cosine |")
    print("|---|" + "---|" * (len(pairs) + 2))
    for name, lad in ladders.items():
        diffs = {(d.x, d.y): d for d in lad.differences}
        cells = [f"{diffs[p].diff_decisive:+.3f} ± {diffs[p].se_decisive:.3f} ({diffs[p].diff:+.4f} ± {diffs[p].se:.4f})"
                 if p in diffs else "-" for p in pairs]
        ratio = lad.nll_decisive["f"] / lad.nll_decisive["a"]
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio:.2f} | {lad.latent_cosine:.3f} |")


if __name__ == "__main__":
    main()
