"""Entry point of a log cleaner worker process (``python -m exactly.storage.cleaner.worker_main
<fd>``): kept apart from ``worker`` so the classes the worker pickles are ``worker``'s, not
``__main__``'s, and the broker can unpickle them."""

from __future__ import annotations

import sys

from exactly.storage.cleaner.worker import main

if __name__ == "__main__":
    sys.exit(main(sys.argv))
