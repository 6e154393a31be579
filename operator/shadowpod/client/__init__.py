"""HTTP client of the gateway API (aiohttp), shared by agents, engines and load generators."""
