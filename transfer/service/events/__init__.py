"""Hooks and events: the pre-upload hook (:mod:`.hook`), the event outbox (:mod:`.outbox`), webhook subscriptions
(:mod:`.subscriptions`), their delivery (:mod:`.delivery`), the caller's event stream (:mod:`.feed`) and the one
object the rest of the service talks to (:mod:`.service`). See docs/HOOKS.md."""
