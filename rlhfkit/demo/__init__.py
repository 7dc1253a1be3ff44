"""`rlhfkit demo`: the built-in customer-support task end to end, with a report."""
