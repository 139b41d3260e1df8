"""``python -m cluster`` is ``pscluster``."""
from .cli import main

main()
