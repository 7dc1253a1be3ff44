"""Evaluation of a policy: RM score, gold score, KL to a reference, and text statistics."""
