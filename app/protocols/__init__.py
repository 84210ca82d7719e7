"""The standard protocols front ends and other agents speak, each a translation of our runs."""
