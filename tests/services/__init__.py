"""Real stacks profiled as people run them: uvicorn on uvloop, FastAPI + httpx, gunicorn,
aiohttp, anyio on trio."""
