"""Builders and trainers for the embedded demo model (not part of the installed package)."""
