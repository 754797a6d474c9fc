"""The top floor: the HTTP server, the offline Engine and the process launcher."""
