"""schemathesis over a real server, at length: ``tests/test_fuzz_api.py``'s run (every route
of the OpenAPI schema, auth on, an admin key, half the cases outside the schema; no 5xx, every
answer conforming) with 1,000 cases or more, on the two tenants' notes of the hostile-input
tests, served by uvicorn on loopback. Prints cases, statuses and failures; exits 1 on any.

    python bench/fuzz_api.py                      # about 1,100 cases, the same each run
    python bench/fuzz_api.py --cases-per-route 400 --random --include-reindex
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures.keys import bearer, keyed_server  # noqa: E402
from tests.fuzz import EXCLUDED, fuzz  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases-per-route", type=int, default=150,
                    help="at most this many per operation, half negative (hypothesis stops early on small ones)")
    ap.add_argument("--random", action="store_true", help="new cases each run (default: the same ones)")
    ap.add_argument("--include-reindex", action="store_true", help="fuzz POST /v1/sources/{name}/reindex too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ragqa-fuzz-") as tmp:
        server = keyed_server(Path(tmp))
        url = next(server).url
        try:
            report = fuzz(url, bearer("admin"), args.cases_per_route, derandomize=not args.random,
                          exclude=None if args.include_reindex else EXCLUDED)
        finally:
            server.close()
    print(report.summary())
    sys.exit(1 if report.failures or any(code >= 500 for code in report.statuses) else 0)


if __name__ == "__main__":
    main()
