"""Fetching a target: the guarded HTTP client, the parsers of the headers a remote party
controls, the hosts a job may name, and robots.txt."""
