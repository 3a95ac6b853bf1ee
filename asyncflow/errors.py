"""The one exception type asyncflow raises for misuse of its own API."""

__all__ = ["AsyncflowError"]


class AsyncflowError(RuntimeError):
    """Raised when asyncflow is used in a way it cannot honour (e.g. a second profiler)."""
