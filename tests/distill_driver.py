"""``python -m tests.distill_driver ARGS`` = ``lopd ARGS`` with the test doubles of
tests/test_distill.py (its toy environment and hashing embedder, no download): the process the
data-parallel tests start, alone or in each of torchrun's processes."""
import stages.distill as distill
from lopd_cli.main import app
from tests.test_distill import HashEmbedder  # importing it registers the toy environment too

distill.load_embedder = lambda name=None, **kw: HashEmbedder()
app(prog_name="lopd")
