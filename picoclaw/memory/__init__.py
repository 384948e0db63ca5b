"""Memory: the Markdown store, the policy that drives it, and retrieval over it."""
