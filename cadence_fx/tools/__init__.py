"""The command line (``cadence-fx``): a subcommand table over one model registry.

Nothing in the library imports this package.
"""
