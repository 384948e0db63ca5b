"""Model providers: any OpenAI-compatible chat completions endpoint."""
