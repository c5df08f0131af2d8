"""Reproducible studies behind the notebooks: simulators and the statistics they report."""
