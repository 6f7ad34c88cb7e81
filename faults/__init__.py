"""The fault-injection suite (`pin faults run`): each job driven through real work while
processes are SIGKILLed, PostgreSQL restarts, remote sides go down, hang or reset, and
clocks jump; then its invariants are checked against an independent record."""
