"""`rapidmoe-chat serve`: an OpenAI-compatible HTTP server over one loaded model.

protocol.py parses and checks requests, reply.py splits a reply into reasoning,
answer and tool calls, worker.py owns the model (one request at a time, in
order), server.py is the Starlette app. Server dependencies are imported only
when `serve` runs.
"""
