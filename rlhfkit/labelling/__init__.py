"""`rlhfkit label`: people compare two responses to a prompt on a local web page, and their answers become
preference data. The candidate pairs are read from JSONL (items.py), every answer is stored durably in one
SQLite file before the page confirms it (store.py), the page's routes run on rlhfkit.web (app.py), and the
export writes prefs.jsonl for `rlhfkit rm` and `rlhfkit dpo`, ties.jsonl and agreement statistics (export.py,
agreement.py). `rlhfkit iterate --judge human` serves the same page each round."""
