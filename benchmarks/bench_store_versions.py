"""How long `lopd store versions` takes on a store written one row per transaction (a version and
a data file per row, as `lopd collect` and `lopd distill` write one task at a time)::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_store_versions.py --versions 200

Each version is read to tell whether it is readable (``stages.store_admin.list_versions``); the
rows are the test trajectory with its transcript repeated 20 times (about the size of a BFCL
episode). Prints the versions, the seconds and whether every version read.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from stages import store_admin
from stages.core.data.store import ExperienceStore
from tests.test_coldstart import make_traj


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=200, help="rows appended one per transaction")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lopd-bench-versions-"))
    store = ExperienceStore.open(root / "store")
    for i in range(args.versions):
        row = make_traj(f"t{i}", i, i + 1)
        store.append([row.model_copy(update={"messages": row.messages * 20})])
    t0 = time.perf_counter()
    versions = store_admin.list_versions(str(root / "store"))
    print(f"{len(versions)} versions in {time.perf_counter() - t0:.1f} s; all readable: "
          f"{all(v.readable for v in versions)}")


if __name__ == "__main__":
    main()
