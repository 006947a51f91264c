"""``python -m labkit COMMAND``: see :mod:`labkit.cli`."""
from labkit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
