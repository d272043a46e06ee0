"""`out/final` (save_final): complete or absent, and readable by others as a plain mkdir would be
(the temporary folder it is renamed from is owner-only)."""
from __future__ import annotations

import os
import stat

from stages.core.models.assembly import save_final
from tests.tiny import tiny_model, tiny_tokenizer


def test_final_folder_gets_a_plain_mkdirs_mode(tmp_path):
    tokenizer = tiny_tokenizer()
    old = os.umask(0o022)
    try:
        final = save_final(tmp_path, tmp_path / "step-1", model="unused", tokenizer=tokenizer,
                           student=tiny_model(tokenizer), adapter=None)
    finally:
        os.umask(old)
    assert stat.S_IMODE(final.stat().st_mode) == 0o755
    assert stat.S_IMODE((final / "student").stat().st_mode) == 0o755
    assert (final / "checkpoint.txt").read_text() == "step-1" and (final / "student" / "config.json").is_file()
