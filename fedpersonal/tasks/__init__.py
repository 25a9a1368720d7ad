"""Tasks: data, models and algorithms wired together for the papers' experiments."""
