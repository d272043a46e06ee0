"""`out/final` (save_final): complete or absent, and readable by others as a plain mkdir would be
(the temporary folder it is renamed from is owner-only)."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from stages.core.models.assembly import save_final
from stages.core.run.modes import share
from tests.tiny import tiny_model, tiny_tokenizer


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_final_folder_and_its_weights_get_a_plain_mkdirs_and_opens_mode(tmp_path):
    """The folders get a plain mkdir's mode, and the weights a plain open's: safetensors writes
    owner-only files (0600), which a shared final/ must not keep."""
    tokenizer = tiny_tokenizer()
    with umask(0o022):
        final = save_final(tmp_path, tmp_path / "step-1", model="unused", tokenizer=tokenizer,
                           student=tiny_model(tokenizer), adapter=None)
    assert stat.S_IMODE(final.stat().st_mode) == 0o755
    assert stat.S_IMODE((final / "student").stat().st_mode) == 0o755
    assert (final / "checkpoint.txt").read_text() == "step-1" and (final / "student" / "config.json").is_file()
    weights = list((final / "student").glob("*.safetensors"))
    assert weights
    assert {stat.S_IMODE(w.stat().st_mode) for w in weights} == {0o644}


def test_share_gives_files_and_folders_a_plain_writes_mode(tmp_path):
    folder = tmp_path / "run"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub").chmod(0o700)
    weights = folder / "sub" / "w.safetensors"
    weights.write_bytes(b"x")
    weights.chmod(0o600)
    with umask(0o027):
        share(folder)
    assert stat.S_IMODE((folder / "sub").stat().st_mode) == 0o750
    assert stat.S_IMODE(weights.stat().st_mode) == 0o640
