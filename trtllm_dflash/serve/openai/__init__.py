"""An OpenAI-compatible HTTP frontend (FastAPI + uvicorn) for a dflash torch engine served by Triton.

It forwards each request to the running tritonserver over gRPC streaming, so there is one engine;
`dflash-serve ENGINE --openai-port PORT` starts and stops it with the server.
"""
