"""Bounds on what one key or connection may hold open at once (429)."""

from __future__ import annotations

from transfer.errors.base import TransferError


class TooManySessions(TransferError):
    code = "too_many_sessions"
    status = 429


class TooManyPlans(TransferError):
    code = "too_many_plans"
    status = 429


class TooManyAuthorizations(TransferError):
    code = "too_many_authorizations"
    status = 429


class MailboxFull(TransferError):
    code = "mailbox_full"
    status = 429


class TooManyJobs(TransferError):
    code = "too_many_jobs"
    status = 429


class TooManySubscriptions(TransferError):
    """One WebSocket connection asked to follow more resource ids than ``tp_max_subscriptions``: it is closed."""

    code = "too_many_subscriptions"
    status = 429
