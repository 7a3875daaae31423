"""The prompt-toolkit chat. The only asyncio-aware code in Crucible."""
