"""How the serving loop's own failure messages begin, so clients (the OpenAI frontend) can tell a
server-side failure from a bad request without importing the loop (and torch)."""

OVERLOADED = "overloaded"  # the queue is full: retry later
INTERNAL_ERROR = "internal error"  # a step failed: the requests in flight fail, the server keeps serving
SHUTTING_DOWN = "server shutting down"  # SIGTERM: what is in flight or queued is cancelled
CANCELLED = "request cancelled by the client"
RANK_LOST = "a tensor-parallel rank died"  # the server cannot step any more: it fails everything and exits

# The model writes why it can no longer serve (a rank died) to this file in the server's private folder;
# dflash-serve watches for it, stops Triton and exits with that line (server.py).
FATAL_FILE_ENV = "DFLASH_FATAL_FILE"
