"""Layer placement and request routing across heterogeneous miners."""
