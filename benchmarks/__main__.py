"""``python -m benchmarks``: run the benchmarks and print one summary table (see run.py)."""
import sys

from .run import main

sys.exit(main())
