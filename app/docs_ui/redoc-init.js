// ReDoc for /openapi.json, from files this server serves itself (no CDN, no web fonts).
Redoc.init("openapi.json", { hideDownloadButton: false }, document.getElementById("redoc"));
