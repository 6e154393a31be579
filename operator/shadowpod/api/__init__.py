"""The gateway's HTTP API contract: bodies shared by the server and its clients."""
