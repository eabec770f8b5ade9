"""Clients of the transfer service: upload, describe, delete, resolve (async and blocking)."""

from transfer.client.client import AsyncTransferClient, TransferClient
from transfer.client.resolver import ResolveOptions, Resolver
from transfer.core.model.content import load_descriptor

__all__ = ["AsyncTransferClient", "ResolveOptions", "Resolver", "TransferClient", "load_descriptor"]
