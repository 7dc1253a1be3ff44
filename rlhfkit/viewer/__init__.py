"""`rlhfkit view`: a read-only local web page of training runs. It finds run folders and reads their
metrics.jsonl, samples.jsonl and report (runs.py), and serves them as JSON and a page that draws every metric's
curve with the runs overlaid, the samples by step and the rendered report (app.py, on rlhfkit.web)."""
