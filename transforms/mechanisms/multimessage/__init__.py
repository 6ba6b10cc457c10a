"""Multi-message shuffle protocols: private-coin Hadamard, count-min, range counting."""
