"""The one error tree: every code is unique and round-trips through the JSON body a client receives."""

from __future__ import annotations

import pytest

from transfer import errors
from transfer.errors import TransferError, error_from_payload, errors_by_code


def test_codes_are_unique_and_statuses_are_http() -> None:
    classes = errors._all_subclasses(TransferError)
    assert len({c.code for c in classes}) == len(classes)
    assert all(400 <= c.status <= 599 for c in classes)


@pytest.mark.parametrize("cls", sorted(errors_by_code().values(), key=lambda c: c.code), ids=lambda c: c.code)
def test_every_error_round_trips_through_its_json_body(cls: type[TransferError]) -> None:
    original = cls("something specific happened", extra=1)
    payload = original.to_payload()
    assert payload["error"] == {
        "code": cls.code,
        "message": "something specific happened",
        "status": cls.status,
        "detail": {"extra": 1},
    }
    rebuilt = error_from_payload(cls.status, payload)
    assert type(rebuilt) is cls and rebuilt.message == original.message


def test_unrecognisable_bodies_become_remote_errors() -> None:
    assert isinstance(error_from_payload(502, "<html>bad gateway</html>"), errors.RemoteError)
    assert isinstance(error_from_payload(500, {"error": {"code": "no_such_code"}}), errors.RemoteError)
