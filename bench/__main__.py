"""``python -m bench NAME [options]``: see :mod:`bench`."""
from bench import main

if __name__ == "__main__":
    raise SystemExit(main())
