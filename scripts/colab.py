"""``python -m scripts.colab --repo OWNER/NAME --ref TAG``: where the lab is published, for Colab (a maintainer's tool).

One setting, ``labkit/data/home.json``, written here together with every notebook's Colab badge and install
cell and the README's Colab links (:func:`scripts.nbcheck.set_home`). Run from the repository's folder.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.nbcheck import HomeError, home_problems, read_home, set_home, validate_home

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``python -m scripts.colab --repo OWNER/NAME --ref TAG``: set the lab's home (:func:`scripts.nbcheck.set_home`).

    Writes ``labkit/data/home.json``, every notebook's Colab badge and install cell, and the README's Colab
    links, in one go, or nothing at all: bad input or a file it cannot rewrite exits 2 before any write.
    Idempotent. ``--unset`` goes back to no home; ``--check`` only reports disagreements (exit 1).
    """
    parser = argparse.ArgumentParser(
        prog="python -m scripts.colab",
        description="Set where this copy of the lab is published, for Colab: its GitHub repository and the tag "
                    "learners get. Rewrites labkit/data/home.json, every notebook's badge and clone cell and the "
                    "README's Colab links. Commit the result, then create the tag on that commit and push both.")
    parser.add_argument("--repo", help="the lab's public GitHub repository, OWNER/NAME (e.g. alice/grpo-lab)")
    parser.add_argument("--ref", help="the tag (or commit) learners clone, e.g. v0.2.0-class")
    parser.add_argument("--unset", action="store_true", help="forget the home: badges and clone cells say there is none")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a notebook or the README disagrees with labkit/data/home.json")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the lab's folder (default: the one holding this labkit)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.check:
            if args.repo or args.ref or args.unset:
                raise HomeError("--check takes no --repo, --ref or --unset")
            problems = home_problems(args.root)
            print("\n".join(problems) if problems else f"every notebook and the README show {read_home(args.root)}")
            return 1 if problems else 0
        if args.unset and (args.repo or args.ref):
            raise HomeError("--unset takes no --repo or --ref")
        if not args.unset and (args.repo is None or args.ref is None):
            raise HomeError("give both --repo OWNER/NAME and --ref TAG (or --unset, or --check)")
        home = validate_home(None if args.unset else args.repo, None if args.unset else args.ref)
        changed = set_home(args.root, home)
    except HomeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not changed:
        print(f"the lab already shows {home}: nothing to change")
        return 0
    rewrote = ", ".join(str(path.relative_to(args.root)) for path in changed)
    print(f"the lab's home is now {home}; rewrote {rewrote}" if home.is_set else
          f"the lab now has no published home; rewrote {rewrote}")
    if home.is_set:
        print(f"next: commit these files, then tag that commit and push both: git tag {home.ref} && "
              f"git push origin HEAD {home.ref} (the badges open the notebooks as they are at {home.ref})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
