"""Model definitions for the packed layout, and loading of their weights."""
