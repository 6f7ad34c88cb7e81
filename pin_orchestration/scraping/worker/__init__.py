"""A worker run: the loop that claims and fetches jobs, the retry planner, and why a queued
job waits."""
