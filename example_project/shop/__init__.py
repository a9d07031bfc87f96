"""A small shop whose pages use the cache the ways Django sites commonly do."""
