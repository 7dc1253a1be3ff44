"""One-off research scripts that no docs table needs, kept for whoever takes the question up again (README.md)."""
