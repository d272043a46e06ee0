"""``python -m lopd_cli`` = the ``lopd`` command (what ``torchrun ... -m lopd_cli distill`` runs in
each process)."""
from lopd_cli.main import app

app(prog_name="lopd")
