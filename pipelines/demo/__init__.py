"""Demos and simulation: synthetic populations with a known truth, simulated devices, checks and plots.

Nothing in the production jobs imports this package."""
