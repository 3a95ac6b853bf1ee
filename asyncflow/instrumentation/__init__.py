"""The recorders: the hot path that wraps coroutines and tasks and counts what they do."""
