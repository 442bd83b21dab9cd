"""`tk serve`: an HTTP translation server with cross-request dynamic batching (torch-free)."""
