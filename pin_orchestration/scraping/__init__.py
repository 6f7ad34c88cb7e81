"""The scraping-job service (SPEC §4, seed 004)."""
