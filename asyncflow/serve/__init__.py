"""The endpoint: the program's side, the HTTP side and the registry (the only layer that imports
aiohttp); imports the foundation and every layer below, never the front door."""
