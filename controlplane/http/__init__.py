"""The control daemon's HTTP surface: thin handlers over the stores and the core."""
