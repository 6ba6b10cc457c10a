"""Real vectors: single-message vector summation and LDP-SGD."""
