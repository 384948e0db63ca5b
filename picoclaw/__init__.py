"""picoclaw: a small agent runtime with long-term memory kept as plain Markdown files."""

__version__ = "0.1.0"
