"""The E2B-compatible API: the unmodified ``e2b`` SDK drives sandboxd (``sandboxd serve --e2b-listen``).

Modules: :mod:`.server` (the ASGI app and its HTTP server), :mod:`.control` (the REST control
plane), :mod:`.process` and :mod:`.filesystem` (envd's Connect services), :mod:`.files` (envd's
``/files`` and ``/health``), :mod:`.gateway` (the calls into sandboxd's own gRPC API) and
:mod:`.tarstream`. ``envd/`` is generated from E2B's published ``.proto`` files
(``proto/e2b/envd``).
"""
