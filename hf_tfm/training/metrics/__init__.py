"""Metric modules for `evaluate`, shipped with the package because the Hub's metric scripts are unreachable offline."""
