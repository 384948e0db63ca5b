"""Tools the model can call: memory search/append and workspace file access."""
