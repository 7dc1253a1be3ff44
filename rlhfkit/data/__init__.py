"""Data: reading JSONL / JSON / CSV / Parquet rows and checking their schema, chat templates, encoding rows to
token ids, padding them into batches, token lengths reported against the options and a model's positions, and
text statistics."""
