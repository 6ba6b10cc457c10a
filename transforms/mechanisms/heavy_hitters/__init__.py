"""Heavy hitters of huge domains by prefix-tree expansion."""
