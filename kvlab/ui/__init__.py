"""Pictures: plots (``viz``), the hotel floor-plan widgets, and the leader's brief."""
