"""``python -m omnicore`` (what ``torchrun -m omnicore train CONFIG`` runs)."""

import sys

from omnicore.cli import main

sys.exit(main())
