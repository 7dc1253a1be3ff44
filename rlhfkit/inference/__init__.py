"""Commands that use a model without training it: `generate`, `score` and `eval`."""
