"""rlhfkit's benchmarks: `python -m bench --list` names them, `python -m bench NAME [--quick]` runs one
(bench/suite.py; bench/README.md says what each measures). The comparisons against TRL are in vs_trl/, the speed
and memory of rlhfkit alone in speed/, what the methods learn in learning/; harness/ runs and records them, stats.py
holds their statistics, and report/ with tables.py renders the docs' tables from the runs kept in reported/."""
