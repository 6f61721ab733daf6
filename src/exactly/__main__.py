import sys

from exactly.cli.main import main

sys.exit(main())
