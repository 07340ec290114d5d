"""``python -m dressage.harbor.prebuild DATASET_DIR...``: build a Harbor dataset's task images ahead.

A run on the ``image`` provider builds them when it loads the dataset (once per Dockerfile content,
:mod:`dressage.harbor.build`); this does the same load ahead of time (in setup, as
``scripts/setup-harbor.sh`` does for the tbench fixture), printing each task's image reference or
build error. Apt-only Dockerfiles keep their Debian root filesystem (:mod:`dressage.harbor.rootfs`).
"""

from __future__ import annotations

import sys

from dressage.harbor.tasks import load_harbor_tasks


def main(argv: list[str] | None = None) -> int:
    """Load every dataset given as the ``image`` provider does; 1 when a build failed."""
    args = sys.argv[1:] if argv is None else argv
    if not args or any(a.startswith("-") for a in args):
        print("usage: python -m dressage.harbor.prebuild DATASET_DIR...", file=sys.stderr)
        return 2
    failed = 0
    for ds in args:
        for task in load_harbor_tasks(ds, images="build"):
            b = task.metadata["harbor"].get("build") or {}
            failed += bool(b.get("error"))
            print(
                f"{task.id}: {b.get('ref') or b.get('error') or 'no image to build (root filesystem or none)'}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
