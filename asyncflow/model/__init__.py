"""The model (cold): what the collector owns, folded on the profiler's thread; imports the
foundation and asyncflow.instrumentation, never views, render, serve or the front door."""
