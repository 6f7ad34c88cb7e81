"""The scraping-job service (docs/requirements.md §4, seed 004)."""
