"""HTTP routes of the gateway, by audience."""
