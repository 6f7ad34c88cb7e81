"""One module per job; importing a module registers its scenarios (see faults.core)."""
