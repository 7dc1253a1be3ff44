"""The docs' result tables, rendered by bench/tables.py from the runs of bench/reported/ that bench/tables.json
selects: parts.py (selections, the line naming the runs, Markdown), and one module per group of tables."""
