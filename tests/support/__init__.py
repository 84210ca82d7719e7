"""The tests' shared helpers, one module per concept; fixtures stay in the conftests."""
