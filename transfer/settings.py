"""Configuration from flags and environment (``TRANSFER_*``), validated once at start-up."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from transfer.core.content import INLINE_THRESHOLD, DownloadMethod

MAX_URL_TTL = 7 * 24 * 3600  # the longest a signed URL may live (S3's presign limit too)


class Settings(BaseSettings):
    """Service settings. Every field can be set as ``TRANSFER_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="TRANSFER_", extra="ignore")

    data_dir: Path = Field(default=Path("transfer-data"), description="local storage directory")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    public_url: str | None = Field(
        default=None, description="base URL put in descriptors; default: the Host the request came to"
    )
    signing_keys: dict[str, str] | None = Field(
        default=None,
        description='JSON {"key id": "secret"}; default: a key generated once and kept in <data_dir>/signing-keys.json',
    )
    signing_key_id: str | None = Field(default=None, description="key id that signs new URLs (default: the first)")
    url_ttl: int = Field(default=3600, gt=0, le=MAX_URL_TTL, description="seconds a signed URL lives")
    default_download_method: DownloadMethod = DownloadMethod.GET
    inline_threshold: int = Field(default=INLINE_THRESHOLD, ge=0, le=16 * INLINE_THRESHOLD)
    max_upload_size: int = Field(default=64 << 30, gt=0, description="largest original (decoded) size accepted")
    max_decode_ratio: float = Field(default=10_000.0, gt=1)
    max_ranges: int = Field(default=64, ge=1, description="ranges per request after coalescing; more: 200 whole")
    buffer_size: int = Field(default=1 << 20, ge=16 << 10, le=64 << 20, description="bytes per read/write call")
    gzip_level: int = Field(default=1, ge=0, le=3, description="python-isal level for gzip/deflate")
    zstd_level: int = Field(default=3, ge=1, le=19)
    compress_on_the_fly: bool = True
    max_description_length: int = Field(default=1024, ge=0)

    @field_validator("public_url")
    @classmethod
    def _strip_slash(cls, v: str | None) -> str | None:
        return v.rstrip("/") if v else v

    def load_signing_keys(self) -> tuple[dict[str, bytes], str]:
        """The signing keys and the active key id; generates and persists one key on first use."""
        if self.signing_keys:
            keys = {kid: secret.encode() for kid, secret in self.signing_keys.items()}
            active = self.signing_key_id or next(iter(keys))
            return keys, active
        path = self.data_dir / "signing-keys.json"
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"k1": secrets.token_urlsafe(32)}, f)
            os.replace(tmp, path)
        stored: dict[str, str] = json.loads(path.read_text())
        keys = {kid: secret.encode() for kid, secret in stored.items()}
        return keys, self.signing_key_id or next(iter(keys))
