"""Key-value mechanisms: Collision, CoCo, and the PrivKV and PCKV baselines, with their encoders."""
