"""``processor inspect``: a web page over the views topic.

- :mod:`.state` follows the views and dead-letter topics (``read_committed``)
  and keeps a small summary per session for a paged, searchable list;
- :mod:`.history` reads one session's events back for time travel (an
  offline fold through the core, never a re-implemented rule);
- :mod:`.app` is the Starlette application (JSON API, server-sent events,
  the token-guarded redrive) and :mod:`.server` runs it with uvicorn, on its
  own (``processor inspect``) or next to ``/metrics`` on the processor's port;
- ``static/`` is the front-end: plain ES modules, no build step, no CDN.
"""
