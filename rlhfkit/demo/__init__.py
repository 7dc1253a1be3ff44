"""`rlhfkit demo`: a built-in task end to end (customer support by default; arithmetic; tool use), with a report."""
