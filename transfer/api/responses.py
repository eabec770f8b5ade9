"""Response classes shared by the front door."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

# what json.dumps(ensure_ascii=True, allow_nan=False, separators=(",", ":")) builds on each call, built once
_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate sent in a JSON body can never make a response unencodable."""

    def render(self, content: Any) -> bytes:
        return _ENCODER.encode(content).encode("ascii")
