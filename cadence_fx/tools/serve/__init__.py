"""Serving tools: ``serve-sim`` (``sim``), ``soak`` (``soak``), their command line (``cmd``)."""
