"""Training-side readers (see issue: runtime)."""
