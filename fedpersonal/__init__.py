"""fedpersonal."""
