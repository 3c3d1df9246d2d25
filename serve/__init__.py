"""ragqa's HTTP service (FastAPI): ``create_app`` in :mod:`serve.app`.

- ``POST /v1/chat/completions``: OpenAI-compatible, with ``citations`` on the answer (:mod:`serve.routes_chat`).
- ``POST /v1/ask``: native, with timings, cache status and ``degraded`` (:mod:`serve.routes_ask`).
- ``GET /v1/streams/{stream_id}``: resume a stream with ``Last-Event-ID`` (:mod:`serve.streams`).
- ``GET /v1/sources``, ``POST /v1/sources/{name}/reindex``, ``GET /v1/documents/{id}`` (:mod:`serve.routes_admin`).
- ``GET /health``, ``GET /ready``, ``GET /metrics`` (:mod:`serve.routes_ops`).

Run it with ``ragqa serve``; the schema is at ``/docs`` and ``/openapi.json``.
"""
