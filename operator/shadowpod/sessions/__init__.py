"""What the gateway does for each session, free of any transport: delivery gates,
the ExchangeFence, schedule firing and agent tokens."""
