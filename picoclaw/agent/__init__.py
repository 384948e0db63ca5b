"""The agent: context building, the turn loop, sessions, and their background work."""
