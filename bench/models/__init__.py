"""Randomized histories and state machines shared by a test (a few seeds) and a bench
(any seed, at length): kept here so that bench/ never imports tests/."""
