"""Repository functions (keyword-only) over the store's tables."""
