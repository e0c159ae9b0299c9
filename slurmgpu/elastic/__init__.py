"""elastic."""
