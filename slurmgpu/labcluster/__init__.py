"""labcluster."""
