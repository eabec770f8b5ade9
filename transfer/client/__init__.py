"""Clients of the transfer service: upload, describe, delete, resolve (async and blocking)."""

from transfer.client.client import AsyncTransferClient, TransferClient, load_descriptor
from transfer.client.resolver import ResolveOptions, Resolver

__all__ = ["AsyncTransferClient", "ResolveOptions", "Resolver", "TransferClient", "load_descriptor"]
