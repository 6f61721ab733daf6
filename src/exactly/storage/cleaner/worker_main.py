"""Entry point of a log cleaner worker process (``python -m exactly.storage.cleaner.worker_main
<fd>``): kept apart from ``worker`` so the classes the worker pickles are ``worker``'s, not
``__main__``'s, and the broker can unpickle them. It lowers the process's priority first, before
the imports of the cleaner (``priority``)."""

from __future__ import annotations

import sys

from exactly.storage.cleaner.priority import lower_priority

if __name__ == "__main__":
    lower_priority()
    from exactly.storage.cleaner.worker import main

    sys.exit(main(sys.argv))
