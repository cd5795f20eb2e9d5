"""``python -m ddp_conformance`` is ``ddp-conformance``."""
import sys

from ddp_conformance.cli import main

sys.exit(main())
