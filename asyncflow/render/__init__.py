"""Renderers of the documents (table report, top, Perfetto trace, Prometheus, OTel, web page,
live reporters); import the foundation and the layers below, never serve or the front door."""
