"""Command-line front end (``perdure``)."""
