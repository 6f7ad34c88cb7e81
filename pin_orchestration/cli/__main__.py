"""`python -m pin_orchestration.cli …` is `pin …` (how `pin up` starts its child processes)."""

from pin_orchestration.cli import main

main()
