"""Channels turn their world (terminal lines, Telegram updates) into AgentLoop.handle calls."""
