"""Local stand-ins for the external services, for `pin up`, the tests and the benchmarks.

Production code never imports them: a stand-in is reached only through the URL that
`pin up` exports (e.g. PIN_SELECTIONS_URL).
"""
