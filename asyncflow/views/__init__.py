"""The documents and findings: pure functions of the model; import the foundation,
asyncflow.instrumentation and asyncflow.model, never render, serve or the front door."""
