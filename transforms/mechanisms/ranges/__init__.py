"""Ranges and quantiles: dyadic trees of frequency oracles, 2-D rectangles, consistent range trees."""
