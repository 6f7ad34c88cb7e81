"""Dagster resources: thin handles on the external parts, configured from the environment."""
