"""``python -m tests.distill_driver ARGS [--then ARGS ...]`` = ``lopd ARGS`` (then the next
command, in the same process) with the test doubles of tests/test_distill.py (its toy environment
and hashing embedder, no download): the process the data-parallel tests start, alone or in each
of torchrun's processes (several commands share one start-up and one process group)."""
import sys

import stages.distill.recipe as distill
from lopd_cli.main import app
from tests.test_distill import HashEmbedder  # importing it registers the toy environment too

distill.load_embedder = lambda name=None, **kw: HashEmbedder()
commands: list[list[str]] = [[]]
for arg in sys.argv[1:]:
    if arg == "--then":
        commands.append([])
    else:
        commands[-1].append(arg)
for argv in commands:
    code = app(argv, prog_name="lopd", standalone_mode=False)
    if code:
        sys.exit(code)
