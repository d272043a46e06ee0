"""Prompt text normalised for comparison: the leakage check and the BFCL environment match prompts
that differ only in case and whitespace."""
from __future__ import annotations

import re


def normalise(prompt: str) -> str:
    """Lower case, whitespace runs collapsed to one space, ends stripped."""
    return re.sub(r"\s+", " ", prompt.lower()).strip()
