"""Response classes shared by the front door."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: a lone surrogate sent in a JSON body can never make a response unencodable."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")
