"""The native HTTP front end: libevent's evhttp (native/httpnative.cpp, the `_httpnative`
module) speaks HTTP/1.1 on its own threads; `server.NativeHttpServer` serves the same ASGI app
(handlers/app.py) on the asyncio loop. Chosen with TOOLKIT_HTTP_FRONTEND=native
(handlers/entrypoints/server.py); uvicorn is the default."""
