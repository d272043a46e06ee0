"""`lopd study`: the method comparison. It runs the other stages (distill, sft, collect, evaluate,
report), so it is the one stage package above the others: recipe, run layout, final evaluations,
the SFT/RFT runs and the study report."""
