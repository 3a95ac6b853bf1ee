"""The endpoint: the program's side, the HTTP side and the registry (with ``render.top``'s
client, the only place that imports aiohttp); imports the foundation and every layer below,
never the front door."""
