"""`lopd store versions|restore`: a store's Lance table versions (stages/store_admin.py)."""
from __future__ import annotations

from typing import Optional

import typer

from lopd_cli.options import STORE_REQUIRED, STORE_TABLE


def store_versions(
    store: str = STORE_REQUIRED,
    table: str = STORE_TABLE,
) -> None:
    """List a table's versions (time, rows) and mark which ones can be read."""
    from stages import store_admin as stage

    stage.run_versions(stage.StoreAdminConfig(store=store, table=table))


def store_restore(
    store: str = STORE_REQUIRED,
    version: Optional[int] = typer.Option(None, "--version", help="Version to bring back (default: the newest readable one)."),
    table: str = STORE_TABLE,
) -> None:
    """Make an earlier, readable version the table's latest (a new version; nothing is deleted)."""
    from stages import store_admin as stage

    stage.run_restore(stage.StoreAdminConfig(store=store, table=table, version=version))
