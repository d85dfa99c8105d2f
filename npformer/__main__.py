"""``python -m npformer ...`` runs the command line (same as the ``npformer`` script)."""
import sys

from .cli.main import main

sys.exit(main())
