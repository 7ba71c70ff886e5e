"""HTTP API (FastAPI). Routes are thin: parse, authenticate, call one service function, return a read
model. Routes never touch the ORM. Errors leave as ``{"error": {"code", "message", "details"}}``.
"""
