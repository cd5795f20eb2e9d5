"""``python -m ddp_conformance`` is ``ddp-conformance``."""
import sys

from .cli import main

sys.exit(main())
