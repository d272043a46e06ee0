"""Loss functions as pure tensor functions: LOPD's, knowledge distillation, policy gradient, SDPO, and the
chunking they share (:mod:`stages.core.losses.chunking`).

The two names the methods' options take (:mod:`stages.methods.options`) are defined here, without
torch: a command line is checked against those options before torch loads."""
from __future__ import annotations

from typing import Literal

DEFAULT_CHUNK_SIZE = 256  # sequence positions per full-vocabulary chunk of a loss
KDReduction = Literal["sequence", "token"]  # a distillation loss: token-mean per sequence, or pooled over tokens
