"""`python -m bench`: list rlhfkit's benchmarks or run one by name (bench/suite.py)."""

import sys

from bench.suite import main

sys.exit(main())
